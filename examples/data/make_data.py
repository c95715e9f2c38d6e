"""Regenerate the example datasets in this directory (fixed seed, no downloads).

Run: python examples/data/make_data.py
The output is deterministic, so the committed files are exactly what this writes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SEED = 20261122
HERE = Path(__file__).parent

# Each topic: subjects, verbs/claims and follow-ups that combine into short paragraphs.
TOPICS = {
    "cluster": (
        ["The scheduler", "Each compute node", "The job script", "A training run", "The storage system",
         "The head node", "Every rank", "The batch queue", "The interconnect", "The checkpoint writer"],
        ["waits for free GPUs before it starts", "reads the dataset from a shared file system",
         "writes a checkpoint every hour", "keeps a small log of memory use", "retries after a node failure",
         "splits the batch across eight devices", "reports its peak memory at the end",
         "sends a signal before the time limit", "gathers gradients after each step",
         "moves optimizer states to host memory"],
        ["so the next job can resume where it stopped.", "which keeps the queue moving.",
         "and the operators read it in the morning.", "because preemption is common on shared clusters.",
         "so nobody has to guess the right batch size.", "and the budget is checked on every rank.",
         "which saves hours of wasted compute.", "while the other ranks keep working."],
    ),
    "cooking": (
        ["The soup", "A loaf of bread", "The sauce", "Fresh pasta", "The roasted vegetables", "A pot of rice",
         "The pancake batter", "The tomato salad", "A pan of onions", "The lentil stew"],
        ["needs a pinch of salt before serving", "rests for ten minutes after baking",
         "simmers slowly on a low flame", "tastes better with fresh herbs", "is stirred every few minutes",
         "cools on the counter overnight", "is seasoned with pepper and lemon", "browns at the edges in a hot oven",
         "thickens as the water cooks away", "is served warm with crusty bread"],
        ["so the flavours have time to settle.", "and the kitchen smells wonderful.",
         "which makes it easy to cook for a crowd.", "because patience is the secret ingredient.",
         "and leftovers keep well for two days.", "so it does not stick to the pan.",
         "which my grandmother always insisted on.", "and everyone asks for a second bowl."],
    ),
    "garden": (
        ["The tomato plants", "A row of carrots", "The apple tree", "The herb bed", "Young lettuce",
         "The climbing beans", "A patch of strawberries", "The rose bush", "The compost heap", "Sunflowers"],
        ["need water early in the morning", "grow quickly after a warm rain", "are planted in loose soil",
         "attract bees in early summer", "are pruned at the end of winter", "need at least six hours of sun",
         "are mulched to keep the roots cool", "are protected from slugs with a copper ring",
         "are harvested before the first frost", "turn kitchen scraps into rich soil"],
        ["so the garden stays healthy all season.", "which the neighbours always admire.",
         "and the harvest fills several baskets.", "because dry soil stunts their growth.",
         "so nothing goes to waste.", "and the birds visit every afternoon.",
         "which is the best part of the year.", "while the weeds are kept under control."],
    ),
    "travel": (
        ["The night train", "Our small hotel", "The mountain path", "The old harbour", "A local guide",
         "The morning ferry", "The city museum", "A quiet village", "The market square", "The coastal road"],
        ["leaves exactly on time", "offers a view of the sea", "is steep but well marked",
         "is busy with fishing boats at dawn", "knows every hidden courtyard", "crosses the bay in forty minutes",
         "is free on the first Sunday of the month", "has one bakery and a church", "fills with stalls on Saturday",
         "winds along the cliffs for miles"],
        ["so we booked our seats early.", "and the breakfast was excellent.",
         "which made the climb worth it.", "because the light there is beautiful.",
         "and we stayed longer than planned.", "so bring a jacket for the wind.",
         "which we would happily visit again.", "while the sun set behind the hills."],
    ),
    "astronomy": (
        ["The full moon", "Jupiter", "A bright comet", "The Milky Way", "Saturn's rings", "The telescope",
         "A meteor shower", "The North Star", "The evening sky", "A lunar eclipse"],
        ["rises just after sunset tonight", "is visible low in the east", "can be seen without binoculars",
         "stretches across the dark summer sky", "are tilted towards us this year", "needs an hour to cool down",
         "peaks in the middle of August", "barely moves during the night", "turns deep blue before the stars appear",
         "turns the moon a coppery red"],
        ["so find a place away from city lights.", "and a small telescope shows its moons.",
         "which delights children and adults alike.", "because the air is clear and dry.",
         "and the best views come after midnight.", "so sailors used it to find their way.",
         "which is worth staying up for.", "while the town below is asleep."],
    ),
}

SENTIMENT_ITEMS = ["the blender", "this novel", "the new phone", "the hotel room", "the restaurant", "this laptop",
                   "the concert", "the hiking boots", "the coffee maker", "the delivery service", "the film",
                   "this jacket", "the museum tour", "the app", "the headphones", "the bicycle"]
SENTIMENT = {
    "positive": ["I loved {x}, it works perfectly.", "{X} exceeded my expectations in every way.",
                 "Really happy with {x}; I would buy it again.", "{X} was wonderful and the staff were kind.",
                 "Great value, {x} is fast and reliable.", "Five stars for {x}, absolutely delightful.",
                 "{X} made my week, highly recommended.", "Everything about {x} felt thoughtful and well made."],
    "negative": ["{X} broke after two days, very disappointing.", "I regret buying {x}; it is slow and noisy.",
                 "Terrible experience with {x}, I asked for a refund.", "{X} was dirty and the service was rude.",
                 "Do not waste your money on {x}.", "{X} stopped working and support never replied.",
                 "Awful, {x} was nothing like the description.", "I was let down by {x}; poor quality overall."],
    "neutral": ["{X} arrived on Tuesday in a plain box.", "{X} is about the size I expected.",
                "I used {x} twice this week.", "{X} comes in black and grey.",
                "The manual for {x} has twelve pages.", "{X} is available in most shops.",
                "I bought {x} for my brother.", "{X} has a one year warranty."],
}

PAIR_TEMPLATES = [
    ("How do I {a}?", "What is the best way to {a}?"),
    ("What is the easiest way to {a}?", "Simple steps to {a}."),
    ("Can you explain how to {a}?", "A short guide on how to {a}."),
    ("Tips to {a}", "Advice for people who want to {a}."),
    ("I want to {a}, where do I start?", "Getting started when you want to {a}."),
]
PAIR_ACTIONS = [
    "bake sourdough bread at home", "learn to ride a bicycle", "grow tomatoes on a balcony",
    "resume a preempted training job", "reduce GPU memory during fine-tuning", "write a good cover letter",
    "keep basil alive indoors", "plan a train trip across Europe", "spot Jupiter with binoculars",
    "make fresh pasta without a machine", "save money on groceries", "fix a flat bicycle tyre",
    "set up a compost bin", "choose a batch size for training", "split a model across several GPUs",
    "brew coffee with a French press", "photograph the Milky Way", "prepare for a job interview",
    "clean a cast iron pan", "start running as a beginner", "learn a new language quickly",
    "read a Slurm job log", "write a checkpoint before a time limit", "pack light for a long trip",
    "cook rice that is not sticky", "store fresh herbs", "measure peak memory of a process",
    "pick a good tent for camping", "teach a child to swim", "paint a small room",
    "debug an out of memory error", "make a budget spreadsheet", "care for a rose bush",
    "find quiet places to study", "plant strawberries in spring", "improve sleep quality",
    "fine-tune a small language model", "make a simple tomato sauce", "clean up an old laptop",
    "watch a meteor shower", "organise a small kitchen", "keep houseplants healthy in winter",
    "choose running shoes", "write clear commit messages", "prepare a picnic for six people",
    "learn to play the ukulele", "make vegetable soup", "back up family photos",
    "shard a dataset across ranks", "train with gradient accumulation", "cook lentils without soaking",
    "plan a garden layout", "make pancakes for breakfast", "reduce screen time",
    "take care of a new puppy", "book cheap flights", "write a short story", "repair a dripping tap",
    "keep a travel journal", "fold a fitted sheet", "grow carrots in containers",
    "estimate the memory of a transformer",
]
FACT_PAIRS = [
    ("What does ZeRO stage 3 shard?", "ZeRO stage 3 partitions parameters, gradients and optimizer states."),
    ("Why use activation checkpointing?", "It trades extra compute for less activation memory."),
    ("What is gradient accumulation?", "Summing gradients over several micro-batches before one optimizer step."),
    ("When should bread dough rest?", "Let the dough rest after kneading so the gluten relaxes."),
    ("Why water plants in the morning?", "Morning watering lets leaves dry before the cool night."),
    ("What makes a lunar eclipse red?", "Sunlight bent through Earth's atmosphere turns the moon red."),
    ("How long should pasta cook?", "Fresh pasta needs only two or three minutes in boiling water."),
    ("What is a micro-batch?", "The sequences one rank processes in a single forward pass."),
    ("Why offload optimizer states?", "Moving optimizer states to host memory frees device memory."),
    ("What does a scheduler do on a cluster?", "It decides which queued job runs on which nodes and when."),
]


def causal(rng: random.Random, n: int) -> list[dict]:
    rows = []
    topics = list(TOPICS.values())
    for _ in range(n):
        subjects, claims, tails = topics[rng.randrange(len(topics))]
        sents = [f"{rng.choice(subjects)} {rng.choice(claims)}, {rng.choice(tails)}" for _ in range(rng.randint(1, 3))]
        rows.append({"text": " ".join(sents)})
    return rows


def sentiment(rng: random.Random, n: int) -> list[dict]:
    rows = []
    labels = list(SENTIMENT)
    for i in range(n):
        label = labels[i % len(labels)]
        item = rng.choice(SENTIMENT_ITEMS)
        text = rng.choice(SENTIMENT[label]).format(x=item, X=item[0].upper() + item[1:])
        rows.append({"text": text, "label": label})
    rng.shuffle(rows)
    return rows


def pairs(rng: random.Random) -> list[dict]:
    rows = []
    for a in PAIR_ACTIONS:
        # Three distinct templates per action, alternating which side is the question.
        for k, (q, p) in enumerate(rng.sample(PAIR_TEMPLATES, 3)):
            text, positive = (q, p) if k % 2 == 0 else (p, q)
            rows.append({"text": text.format(a=a), "positive": positive.format(a=a)})
    rows += [{"text": q, "positive": p} for q, p in FACT_PAIRS]
    rows += arithmetic(rng)
    rng.shuffle(rows)
    return rows


NUMBER_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
).split()
ARITH_QUESTIONS = ["What is {a} plus {b}?", "How much is {a} and {b} together?", "Add {a} to {b}."]
ARITH_ANSWERS = ["The sum is {s}.", "It makes {s}.", "{S}."]


def arithmetic(rng: random.Random) -> list[dict]:
    """Sums in words: a pretrained MiniLM ranks these worse than chance, so the contrastive loss visibly falls."""
    rows = []
    for a in range(1, 11):
        for b in range(0, 11):
            s = NUMBER_WORDS[a + b]
            q, ans = rng.choice(ARITH_QUESTIONS), rng.choice(ARITH_ANSWERS)
            rows.append({"text": q.format(a=a, b=b), "positive": ans.format(s=s, S=s.capitalize())})
    return rows


SYSTEM_PROMPTS = ["You are a helpful assistant.", "Answer in one short sentence.", "You are a patient teacher."]
TOPIC_QUESTIONS = ["Tell me something about {t}.", "What do you know about {t}?", "Say one thing about {t}."]
TOPIC_NAMES = {"cluster": "cluster computing", "cooking": "cooking", "garden": "gardening", "travel": "travel",
               "astronomy": "the night sky"}


def sentence(rng: random.Random, topic: str) -> str:
    subjects, claims, tails = TOPICS[topic]
    return f"{rng.choice(subjects)} {rng.choice(claims)}, {rng.choice(tails)}"


def chat(rng: random.Random, n: int) -> list[dict]:
    """TRL-style conversations (`messages`): a topic question or a sum in words, sometimes a system prompt and a
    second turn, so the loss masks more than one assistant reply."""
    rows = []
    for i in range(n):
        messages = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}] if i % 3 == 0 else []
        for _ in range(1 + (i % 4 == 0)):
            if rng.random() < 0.5:
                topic = rng.choice(list(TOPICS))
                q, a = rng.choice(TOPIC_QUESTIONS).format(t=TOPIC_NAMES[topic]), sentence(rng, topic)
            else:
                x, y = rng.randint(1, 10), rng.randint(0, 10)
                q, a = f"What is {x} plus {y}?", f"{NUMBER_WORDS[x + y].capitalize()}."
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        rows.append({"messages": messages})
    return rows


def prompt_completion(rng: random.Random, n: int) -> list[dict]:
    """TRL-style prompt-completion pairs: the start of a sentence and its rest (the loss is on the rest)."""
    rows = []
    for _ in range(n):
        subjects, claims, tails = TOPICS[rng.choice(list(TOPICS))]
        rows.append({"prompt": rng.choice(subjects), "completion": f" {rng.choice(claims)}, {rng.choice(tails)}"})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def main() -> None:
    rng = random.Random(SEED)
    write_jsonl(HERE / "causal.jsonl", causal(rng, 400))
    write_jsonl(HERE / "sentiment.jsonl", sentiment(rng, 360))
    write_jsonl(HERE / "pairs.jsonl", pairs(rng))
    chat_rng = random.Random(SEED + 1)  # its own stream: the files above stay byte for byte what they were
    write_jsonl(HERE / "chat.jsonl", chat(chat_rng, 240))
    write_jsonl(HERE / "prompt_completion.jsonl", prompt_completion(chat_rng, 240))


if __name__ == "__main__":
    main()
