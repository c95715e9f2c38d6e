"""launcher.cli.pipes: a reader that goes away does not end a run."""

from __future__ import annotations

import io
import os
import sys

from launcher.cli.pipes import SurvivingStream, closed_output_note, outliving_closed_output


def test_a_closed_pipe_sends_the_rest_to_dev_null_without_an_error():
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first byte
    stream = io.TextIOWrapper(io.FileIO(w, "w"), write_through=False)
    out = SurvivingStream(stream)
    print("plan: a line", file=out)
    out.flush()  # here the pipe would raise BrokenPipeError
    assert out.dropped_at is not None
    print("the table", file=out, flush=True)  # and from now on everything goes to /dev/null
    assert os.path.samefile(f"/proc/self/fd/{w}", os.devnull)
    assert "stdout was closed at" in closed_output_note(out)
    stream.close()


def test_the_streams_are_put_back_and_an_open_one_is_untouched(capsys):
    saved = sys.stdout, sys.stderr
    with outliving_closed_output() as (out, err):
        print("hello")
        assert sys.stdout is out and out.isatty() is False
    assert (sys.stdout, sys.stderr) == saved
    assert capsys.readouterr().out == "hello\n" and closed_output_note(out) is None
