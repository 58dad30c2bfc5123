"""Offline task generators: seeded, with fixed train/test splits, no download.

Each generator draws distinct prompts from `random.Random(f"{name}:{seed}")` (a variant's `stream`: its base's
name): the first 200 (fewer if `test_size` is smaller) open the test split, the next `train_size` form the training
split, and the test split's remaining prompts (up to `test_size`, 1,000 by default: ±1.5 points of standard error on
an exact match near 50%) are drawn after those. So a test prompt never appears in training, the training split does
not depend on the test split's size, and the same seed gives the same splits on every machine. Answers are short (a
number, a list, a spelling) so that a small model can learn them in minutes and exact match can verify them.
"""

from __future__ import annotations

import random
import re
from functools import cached_property

from redline.tasks.base import Example, Split, Task

# short common words (spelling, letter counting, key-value keys)
WORDS = tuple("""
apple river stone cloud green house paper music table window garden bread light water chair plant money dream
horse ocean tiger lemon pearl sugar candle forest bridge rocket planet spring summer winter autumn silver golden
button pencil mirror basket castle dragon island jungle ladder magnet needle orange pepper rabbit saddle turtle
violin wizard yellow zebra anchor bottle carpet desert engine falcon ginger hammer insect jacket kettle lizard
marble number oyster parrot quartz ribbon salmon tomato walnut cherry banana grape melon peach plum kiwi mango
berry coffee butter cheese honey olive onion garlic salad pasta pizza sauce cookie donut toast juice cream
""".split())
NAMES = ("Ava", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivy", "Jon", "Kim", "Leo", "Mia", "Ned", "Ola",
         "Pia", "Raj", "Sam", "Tia", "Uma")
ITEMS = ("apples", "books", "coins", "marbles", "stickers", "cards", "pens", "shells", "stamps", "cookies")
_NUMBER = re.compile(r"-?\d+")


def _word(rng: random.Random) -> str:
    """A common word or a pronounceable made-up one (consonant-vowel syllables): the made-up ones make the prompt
    space large enough for disjoint splits and test spelling rather than memory."""
    if rng.random() < 0.5:
        return rng.choice(WORDS)
    return "".join(rng.choice("bcdfghjklmnprstvwz") + rng.choice("aeiou") for _ in range(rng.randint(2, 4)))


FIRST_TEST = 200  # test prompts drawn before the training split (every split made before test_size grew to 1,000)


class GeneratedTask(Task):
    """A task whose examples a seeded generator makes (subclasses give `make(rng)`). train_size None: the task's
    own default (`default_train_size`)."""

    default_train_size = 5000
    stream: str | None = None
    """The name whose generator stream draws the examples (None: the task's own): a variant that asks the same
    problems with other replies names its base, so both share their splits."""

    def __init__(self, seed: int = 0, train_size: int | None = None, test_size: int = 1000):
        self.seed, self.test_size = seed, test_size
        self.train_size = self.default_train_size if train_size is None else train_size

    def make(self, rng: random.Random) -> Example:
        raise NotImplementedError

    @cached_property
    def _splits(self) -> dict[str, list[Example]]:
        rng = random.Random(f"{self.stream or self.name}:{self.seed}")
        seen: set[str] = set()
        out: list[Example] = []
        wanted = self.test_size + self.train_size
        tries = 0
        while len(out) < wanted and tries < 50 * wanted:  # the prompt space of every task is far larger than this
            tries += 1
            example = self.make(rng)
            if example.prompt not in seen:
                seen.add(example.prompt)
                out.append(example)
        if len(out) < wanted:
            from redline.errors import UserError

            raise UserError(f"task {self.name} has fewer than {wanted} distinct examples; lower train_size")
        first = min(self.test_size, FIRST_TEST)
        return {"test": out[:first] + out[first + self.train_size:], "train": out[first:first + self.train_size]}

    def examples(self, split: Split) -> list[Example]:
        return list(self._splits[split])


class NumericTask(GeneratedTask):
    """An answer that is one integer: the last integer in a completion is its answer."""

    def extract(self, completion: str) -> str | None:
        found = _NUMBER.findall(completion.split("\n\n")[0])
        return found[-1].lstrip("+") if found else None

    def normalize(self, answer: str) -> str:
        return answer.strip()

    def corrupt(self, example: Example, rng: random.Random) -> str:
        value = int(example.answer)
        offsets = [d for d in range(-5, 6) if d and value + d >= 0]
        return str(value + rng.choice(offsets))


class Arithmetic(NumericTask):
    name = "arithmetic"
    description = "word problems with a numeric answer (addition, subtraction, multiplication)"

    def make(self, rng: random.Random) -> Example:
        who, item = rng.choice(NAMES), rng.choice(ITEMS)
        kind = rng.choice(("add", "add", "sub", "mul"))
        if kind == "add":
            a, b = rng.randint(1, 20), rng.randint(1, 20)
            prompt, answer = f"{who} has {a} {item} and gets {b} more. How many {item} does {who} have now?", a + b
        elif kind == "sub":
            a = rng.randint(2, 30)
            b = rng.randint(1, a)
            prompt, answer = f"{who} has {a} {item} and gives away {b}. How many {item} are left?", a - b
        else:
            a, b = rng.randint(2, 9), rng.randint(2, 9)
            prompt, answer = f"{who} buys {a} packs of {b} {item}. How many {item} is that in total?", a * b
        return Example(prompt, str(answer), meta={"sum": (a, {"add": "+", "sub": "-", "mul": "*"}[kind], b)})


class WorkedArithmetic(Arithmetic):
    """`arithmetic`'s problems (the same splits) with a worked reply to train on: a sum or difference column by
    column, a product as one fact, the answer last ("7 + 15: 7 + 5 = 12, carry 1; 0 + 1 + 1 = 2. 22"). A number
    after a space is a token per digit, so the answer is written digit by digit from the steps before it, each step
    a one-digit fact that greedy decoding can still get wrong; graded, like `arithmetic`, by the last number."""

    name = "arithmetic_worked"
    description = "arithmetic's word problems, trained on worked column sums (the answer last)"
    stream = "arithmetic"

    def make(self, rng: random.Random) -> Example:
        example = super().make(rng)
        return Example(example.prompt, example.answer, meta=example.meta, solution=_column(*example.meta["sum"]))

    def corrupt(self, example: Example, rng: random.Random) -> str:
        """The worked reply with a slip: the ones' or tens' result (a product: the product) off by 1 to 3, carried
        into the answer, so the rejected reply ends in a wrong one."""
        a, op, b = example.meta["sum"]
        for _ in range(50):
            slip, column = rng.choice((-3, -2, -1, 1, 2, 3)), rng.choice(("ones", "tens"))
            reply = _column(a, op, b, **{column: slip})
            if reply is not None:
                return reply
        return _column(a, op, b, ones=1)  # +1 in the ones' column is always a valid slip


def _column(a: int, op: str, b: int, ones: int = 0, tens: int = 0) -> str | None:
    """The worked reply to a op b, with the ones' and tens' results off by `ones` and `tens` (a product: off by
    `ones + tens`); None where a slip makes no well-formed step (a negative result, or a ones' result past a
    column's range)."""
    if op == "*":
        product = a * b + ones + tens
        return f"{a} * {b} = {product}." if product >= 0 else None
    (ta, oa), (tb, ob) = divmod(a, 10), divmod(b, 10)
    if op == "+":
        low = oa + ob + ones
        carry = int(low >= 10)
        high = ta + tb + carry + tens
        if not 0 <= low <= 18 or high < 0:
            return None
        ones_step = f"{oa} + {ob} = {low}" + (", carry 1" if carry else "")
        tens_step = f"{ta} + {tb}" + (" + 1" if carry else "") + f" = {high}"
    else:
        borrow = int(oa < ob)
        low = 10 * borrow + oa - ob + ones
        high = ta - tb - borrow + tens
        if not 0 <= low <= 9 or high < 0:
            return None
        ones_step = (f"1{oa} - {ob} = {low}, borrow 1" if borrow else f"{oa} - {ob} = {low}")
        tens_step = f"{ta} - {tb}" + (" - 1" if borrow else "") + f" = {high}"
    return f"{a} {op} {b}: {ones_step}; {tens_step}. {10 * high + low % 10}"


class MultiStepArithmetic(NumericTask):
    """Two operations on two-digit numbers: about 10^5 distinct problems, so a model cannot answer from memorised
    facts as it can on `arithmetic` (a few hundred distinct sums and products). Each example carries a worked
    solution ("45 + 38 = 83, 83 - 20 = 63.") that SFT trains on, so that a model learns the two steps rather than
    a few thousand answers by heart; the training split is 50,000 problems. A reply is graded by its last number."""

    name = "arithmetic_multistep"
    description = "two-step word problems with two-digit numbers (add then subtract, or multiply then add)"
    default_train_size = 50_000

    def make(self, rng: random.Random) -> Example:
        who, item = rng.choice(NAMES), rng.choice(ITEMS)
        if rng.random() < 0.5:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            c = rng.randint(1, a + b)
            prompt = f"{who} has {a} {item}, gets {b} more and then gives away {c}. How many {item} are left?"
            steps = ((a, "+", b, a + b), (a + b, "-", c, a + b - c))
        else:
            a, b, c = rng.randint(2, 9), rng.randint(11, 25), rng.randint(10, 99)
            prompt = f"{who} buys {a} packs of {b} {item} and already had {c}. How many {item} does {who} have now?"
            steps = ((a, "*", b, a * b), (a * b, "+", c, a * b + c))
        return Example(prompt, str(steps[1][3]), solution=_worked(steps), meta={"steps": steps})

    def corrupt(self, example: Example, rng: random.Random) -> str:
        """The worked solution with a slip: one step's result off by 1 to 10 (a slip in the first step carries
        into the second), so the rejected reply ends in a wrong answer."""
        (x, op1, y, r1), (_, op2, z, r2) = example.meta["steps"]
        slip = rng.choice([d for d in range(-10, 11) if d])
        if rng.random() < 0.5 and r1 + slip > 0:
            r1 += slip
            r2 = r1 + z if op2 == "+" else r1 - z
        else:
            r2 += slip
        return _worked(((x, op1, y, r1), (r1, op2, z, r2)))


def _worked(steps) -> str:
    """((x, op, y, result), ...) -> "x op y = result, ... ." (the last result is the answer)."""
    return ", ".join(f"{x} {op} {y} = {r}" for x, op, y, r in steps) + "."


class LetterCount(NumericTask):
    name = "letter_count"
    description = "how many times a letter appears in a word"

    def make(self, rng: random.Random) -> Example:
        word = _word(rng)
        letter = rng.choice(word) if rng.random() < 0.8 else rng.choice("abcdefghijklmnopqrstuvwxyz")
        return Example(f'How many times does the letter "{letter}" appear in "{word}"?', str(word.count(letter)))


class Spelling(GeneratedTask):
    name = "spelling"
    description = "spell a word letter by letter"

    def make(self, rng: random.Random) -> Example:
        word = _word(rng)
        style = rng.choice(("Spell the word", "Spell out", "Write out the letters of"))
        return Example(f'{style} "{word}" letter by letter.', " ".join(word))

    def extract(self, completion: str) -> str | None:
        letters = re.findall(r"[a-z]", completion.split("\n")[0].lower())
        return "".join(letters) or None

    def normalize(self, answer: str) -> str:
        return "".join(re.findall(r"[a-z]", answer.lower()))

    def corrupt(self, example: Example, rng: random.Random) -> str:
        letters = example.answer.split()
        for _ in range(20):
            i = rng.randrange(len(letters) - 1)
            if letters[i] != letters[i + 1]:
                letters[i], letters[i + 1] = letters[i + 1], letters[i]
                return " ".join(letters)
        return " ".join(letters[:-1])  # every neighbour equal: drop a letter


class ListTask(GeneratedTask):
    """An answer that is a list: its items, in order, compared after splitting on commas and spaces."""

    def extract(self, completion: str) -> str | None:
        items = re.split(r"[,\s]+", completion.split("\n")[0].strip().strip("."))
        items = [i for i in items if i]
        return ", ".join(i.lower() for i in items) or None

    def normalize(self, answer: str) -> str:
        return self.extract(answer) or ""

    def corrupt(self, example: Example, rng: random.Random) -> str:
        items = example.answer.split(", ")
        pairs = [(i, j) for i in range(len(items)) for j in range(i + 1, len(items)) if items[i] != items[j]]
        if not pairs:
            return ", ".join(items[:-1])
        i, j = rng.choice(pairs)
        items[i], items[j] = items[j], items[i]
        return ", ".join(items)


class SortNumbers(ListTask):
    name = "sort"
    description = "sort a list of numbers from smallest to largest"

    def make(self, rng: random.Random) -> Example:
        values = [rng.randint(0, 99) for _ in range(rng.randint(3, 6))]
        return Example(f"Sort from smallest to largest: {', '.join(map(str, values))}",
                       ", ".join(map(str, sorted(values))))


class ReverseList(ListTask):
    name = "reverse"
    description = "reverse a list of words"

    def make(self, rng: random.Random) -> Example:
        words = rng.sample(WORDS, rng.randint(3, 5))
        return Example(f"Reverse this list: {', '.join(words)}", ", ".join(reversed(words)))


class KeyValueRecall(NumericTask):
    name = "kv_recall"
    description = "recall the value of one key from a list of key=value pairs"

    def make(self, rng: random.Random) -> Example:
        keys = rng.sample(WORDS, rng.randint(3, 6))
        values = [rng.randint(0, 99) for _ in keys]
        asked = rng.randrange(len(keys))
        pairs = ", ".join(f"{k}={v}" for k, v in zip(keys, values))
        return Example(f"Remember: {pairs}. What is the value of {keys[asked]}?", str(values[asked]),
                       meta={"values": values})

    def corrupt(self, example: Example, rng: random.Random) -> str:
        others = [v for v in example.meta.get("values", ()) if str(v) != example.answer]
        return str(rng.choice(others)) if others else super().corrupt(example, rng)


class MultipleChoiceOf(Task):
    """A generative task asked as multiple choice: the answer among n - 1 corrupted ones (seeded), scored by
    log-likelihood. Named `NAME_mc` (e.g. arithmetic_mc)."""

    kind = "multiple_choice"

    def __init__(self, task: GeneratedTask, n_choices: int = 4):
        self.task, self.n_choices = task, n_choices
        self.name = f"{task.name}_mc"
        self.description = f"{task.description}, as {n_choices}-way multiple choice"

    @cached_property
    def _splits(self) -> dict[str, list[Example]]:
        out = {}
        for split in ("test", "train"):
            rng = random.Random(f"{self.name}:{self.task.seed}:{split}")
            examples = []
            for e in self.task.examples(split):
                choices = {e.reply}  # a task with worked solutions is asked among solutions with slips
                for _ in range(50):
                    if len(choices) == self.n_choices:
                        break
                    choices.add(self.task.corrupt(e, rng))
                ordered = sorted(choices)
                rng.shuffle(ordered)
                examples.append(Example(e.prompt, e.reply, tuple(ordered), ordered.index(e.reply)))
            out[split] = examples
        return out

    def examples(self, split: Split) -> list[Example]:
        return list(self._splits[split])

    def extract(self, completion: str) -> str | None:
        return self.task.extract(completion)

    def normalize(self, answer: str) -> str:
        return self.task.normalize(answer)


GENERATORS: dict[str, type[GeneratedTask]] = {cls.name: cls for cls in (
    Arithmetic, WorkedArithmetic, MultiStepArithmetic, Spelling, LetterCount, SortNumbers, ReverseList, KeyValueRecall)}
