"""Eight synthetic families of verifiable math problems: the tiny scale's benchmarks.

Each problem is one line of question, a few short solution steps (one per line)
and a final ``\\boxed{answer}``; every answer is an integer. The prompt is
``fp8rl.rewards.format_prompt(question)`` and the target response is
``solution`` followed by EOS, so one example is ``prompt + solution`` (at most
``MAX_EXAMPLE_CHARS`` characters: the models are character-level and tiny).

Families (``FAMILIES``), each with difficulties 1-3 (``DIFFICULTIES``):

- ``add_sub``: chains of additions and subtractions, 2 to 4 terms, left to right.
- ``multiply``: products by place-value parts (``48*7``, ``348*7``, ``47*36``).
- ``order_of_ops``: ``+ - *`` with precedence, parentheses at difficulty 3.
- ``modulo``: remainders (``a mod m``) via the largest multiple of ``m``.
- ``max_min``: the largest or smallest of 3-5 numbers by running comparison.
- ``digit_sum``: the sum of the digits of a 3-, 5- or 7-digit number.
- ``linear_eq``: ``ax+b=c`` and, at difficulty 3, ``ax+b=cx+d`` for integer x.
- ``fraction_of``: a fraction (``3/4 of 48``) or a percentage (``35% of 80``).

Held out: a question is held out when the SHA-256 of its text falls in one of
``HELD_OUT_BUCKETS`` buckets (:func:`is_held_out`). The evaluation sets draw only
held-out questions and :func:`generate` / :func:`training_mix` never do, for any
seed. The evaluation sets are committed as ``data/tiny_eval/<family>.jsonl``
(schema in ``docs/tasks.md``); :func:`write_eval_sets` regenerates them.

Deterministic: every random stream is a ``random.Random`` seeded from SHA-256 of
its name and seed, never from Python's ``hash()``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from math import gcd
from pathlib import Path
from typing import Any

from fp8rl.config.run import EVAL_ITEMS_PER_DIFFICULTY
from fp8rl.rewards import format_prompt

logger = logging.getLogger(__name__)

FAMILIES: tuple[str, ...] = (
    "add_sub",
    "multiply",
    "order_of_ops",
    "modulo",
    "max_min",
    "digit_sum",
    "linear_eq",
    "fraction_of",
)
DIFFICULTIES: tuple[int, ...] = (1, 2, 3)

MAX_PROMPT_CHARS = 56
"""Longest prompt (question + newline) any generator emits."""
MAX_SOLUTION_CHARS = 64
"""Longest solution (steps + boxed answer, without EOS) any generator emits."""
MAX_EXAMPLE_CHARS = 112
"""Longest prompt + solution any generator emits (add 1 for EOS in tokens)."""
PROMPT_BUDGET = 64
"""Prompt positions a sampler reserves for a tiny prompt (at least ``MAX_PROMPT_CHARS``:
one token per character); both backends size their sequences with it."""

HELD_OUT_BUCKETS = 8
"""One SHA-256 bucket in this many holds the held-out questions (1/8 of each space)."""

EVAL_SEED = 5
# Each evaluation set: EVAL_ITEMS_PER_DIFFICULTY distinct held-out items per difficulty
# (150 per family); fp8rl.config holds the number, so that readers of run configs count
# items without importing the world.

EVAL_DIR = Path(__file__).resolve().parents[2] / "data" / "tiny_eval"
"""The committed evaluation sets (repository root ``data/tiny_eval``)."""

EVAL_FIELDS = ("id", "family", "difficulty", "question", "solution", "answer", "prompt")
"""Keys of one evaluation JSONL record, in file order."""

_MAX_ATTEMPTS = 10_000


@dataclass(frozen=True)
class Problem:
    """One problem: the question, its worked solution ending in ``\\boxed{answer}``."""

    family: str
    question: str
    solution: str
    answer: str
    difficulty: int
    id: str

    @property
    def prompt(self) -> str:
        """What the model sees: ``format_prompt(question)``."""
        return format_prompt(self.question)

    @property
    def text(self) -> str:
        """The whole example, ``prompt + solution`` (the tokenizer's EOS follows it)."""
        return self.prompt + self.solution

    def to_record(self) -> dict[str, Any]:
        """The JSONL record: ``EVAL_FIELDS`` in order (``prompt`` included for lm-eval)."""
        record = asdict(self)
        record["prompt"] = self.prompt
        return {key: record[key] for key in EVAL_FIELDS}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Problem:
        """Inverse of :meth:`to_record`; ``prompt``, if present, must match the question."""
        missing = [key for key in EVAL_FIELDS if key != "prompt" and key not in record]
        if missing:
            raise ValueError(f"record {record.get('id')!r} lacks {missing}")
        problem = cls(
            family=record["family"],
            question=record["question"],
            solution=record["solution"],
            answer=record["answer"],
            difficulty=int(record["difficulty"]),
            id=record["id"],
        )
        if "prompt" in record and record["prompt"] != problem.prompt:
            raise ValueError(f"record {problem.id!r}: prompt does not match the template")
        return problem


# --- deterministic randomness and the held-out split ---------------------------------------


def _stable_int(*parts: object) -> int:
    text = "\x1f".join(str(part) for part in parts)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def _rng(*parts: object) -> random.Random:
    return random.Random(_stable_int(*parts))


def is_held_out(question: str) -> bool:
    """True when ``question`` belongs to the held-out split (evaluation only)."""
    return _stable_int("held-out", question) % HELD_OUT_BUCKETS == 0


# --- the eight generators: (rng, difficulty) -> (question, steps, answer) -------------------

Generated = tuple[str, list[str], int]


def _chain_steps(first: int, moves: Sequence[tuple[str, int]]) -> tuple[list[str], int]:
    """Left-to-right ``a op b=c`` steps for + and -."""
    steps, value = [], first
    for op, operand in moves:
        result = value + operand if op == "+" else value - operand
        steps.append(f"{value}{op}{operand}={result}")
        value = result
    return steps, value


def _add_sub(rng: random.Random, difficulty: int) -> Generated:
    terms, low, high = {1: (2, 10, 99), 2: (3, 10, 999), 3: (4, 10, 999)}[difficulty]
    numbers = [rng.randint(low, high) for _ in range(terms)]
    ops = [rng.choice("+-") for _ in range(terms - 1)]
    if difficulty == 1 and ops[0] == "-" and numbers[0] < numbers[1]:
        numbers[0], numbers[1] = numbers[1], numbers[0]
    moves = list(zip(ops, numbers[1:], strict=True))
    steps, answer = _chain_steps(numbers[0], moves)
    if difficulty < 3 and any(int(step.rsplit("=", 1)[1]) < 0 for step in steps):
        raise _Reject  # negatives only at difficulty 3
    expression = str(numbers[0]) + "".join(f"{op}{n}" for op, n in moves)
    return f"Compute {expression}.", steps, answer


def _place_parts(number: int) -> list[int]:
    """Non-zero place-value parts, largest first: 348 -> [300, 40, 8]."""
    digits = str(number)
    parts = [int(d) * 10 ** (len(digits) - 1 - i) for i, d in enumerate(digits)]
    return [part for part in parts if part]


def _multiply(rng: random.Random, difficulty: int) -> Generated:
    if difficulty == 3:
        left, right = rng.randint(11, 99), rng.randint(11, 99)
        products = [(f"{left}*{part}", left * part) for part in _place_parts(right)]
        question = f"Compute {left}*{right}."
    else:
        big = rng.randint(11, 99) if difficulty == 1 else rng.randint(101, 999)
        small = rng.randint(2, 9)
        big_first = rng.random() < 0.5
        products = [
            (f"{part}*{small}" if big_first else f"{small}*{part}", part * small)
            for part in _place_parts(big)
        ]
        question = f"Compute {big}*{small}." if big_first else f"Compute {small}*{big}."
    steps = [f"{text}={value}" for text, value in products]
    answer = sum(value for _, value in products)
    if len(products) > 1:
        steps.append("+".join(str(value) for _, value in products) + f"={answer}")
    return question, steps, answer


def _apply(left: int, op: str, right: int) -> int:
    return {"+": left + right, "-": left - right, "*": left * right}[op]


def _evaluate_with_steps(tokens: list[Any]) -> tuple[list[str], int]:
    """Evaluate ints and '+', '-', '*', '(', ')' by precedence, one step per operation.

    Parentheses first (innermost), then '*' left to right, then '+'/'-' left to right.
    """
    tokens, steps = list(tokens), []

    def reduce_flat(flat: list[Any]) -> int:
        for ops in ("*", "+-"):
            i = 1
            while i < len(flat):
                if flat[i] in ops:
                    value = _apply(flat[i - 1], flat[i], flat[i + 1])
                    steps.append(f"{flat[i - 1]}{flat[i]}{flat[i + 1]}={value}")
                    flat[i - 1 : i + 2] = [value]
                else:
                    i += 2
        (value,) = flat
        return value

    while "(" in tokens:
        close = tokens.index(")")
        open_ = max(i for i in range(close) if tokens[i] == "(")
        value = reduce_flat(tokens[open_ + 1 : close])
        if value < 0:
            raise _Reject  # keeps steps free of "3*-4"
        tokens[open_ : close + 1] = [value]
    return steps, reduce_flat(tokens)


def _order_of_ops(rng: random.Random, difficulty: int) -> Generated:
    def factor() -> int:
        return rng.randint(2, 9)

    def term() -> int:
        return rng.randint(1, 30)

    if difficulty == 1:
        add_op = rng.choice("+-")
        if rng.random() < 0.5:
            tokens: list[Any] = [term(), add_op, factor(), "*", factor()]
        else:
            tokens = [factor(), "*", factor(), add_op, term()]
    elif difficulty == 2:
        ops = [rng.choice("+-*") for _ in range(3)]
        if "*" not in ops or ops.count("*") == 3:
            raise _Reject
        # operand i sits between ops[i - 1] and ops[i]: a factor if either is '*'
        operands = [factor() if "*" in ops[max(i - 1, 0) : i + 1] else term() for i in range(4)]
        tokens = [operands[0]]
        for op, operand in zip(ops, operands[1:], strict=True):
            tokens += [op, operand]
    else:
        group = ["(", rng.randint(1, 20), rng.choice("+-"), rng.randint(1, 20), ")"]
        shape = rng.randrange(3)
        if shape == 0:
            tokens = [*group, "*", factor(), rng.choice("+-"), term()]
        elif shape == 1:
            tokens = [term(), rng.choice("+-"), factor(), "*", *group]
        else:
            other = ["(", rng.randint(1, 20), rng.choice("+-"), rng.randint(1, 9), ")"]
            tokens = [*group, "*", *other]
    steps, answer = _evaluate_with_steps(tokens)
    if difficulty < 3 and any(int(step.rsplit("=", 1)[1]) < 0 for step in steps):
        raise _Reject
    return f"Compute {''.join(str(token) for token in tokens)}.", steps, answer


def _modulo(rng: random.Random, difficulty: int) -> Generated:
    if difficulty == 1:
        modulus, number = rng.randint(2, 12), rng.randint(10, 99)
    elif difficulty == 2:
        modulus, number = rng.randint(2, 9), rng.randint(100, 999)
    else:
        modulus, number = rng.randint(11, 29), rng.randint(100, 999)
    if number < 2 * modulus:
        raise _Reject
    quotient, remainder = divmod(number, modulus)
    multiple = modulus * quotient
    steps = [f"{modulus}*{quotient}={multiple}", f"{number}-{multiple}={remainder}"]
    return f"Find {number} mod {modulus}.", steps, remainder


def _max_min(rng: random.Random, difficulty: int) -> Generated:
    count, low, high = {1: (3, 10, 99), 2: (4, 100, 999), 3: (5, -999, 999)}[difficulty]
    numbers = rng.sample(range(low, high + 1), count)
    largest = rng.random() < 0.5
    best, steps = numbers[0], []
    for number in numbers[1:]:
        steps.append(f"{best}<{number}" if best < number else f"{best}>{number}")
        best = max(best, number) if largest else min(best, number)
    word = "largest" if largest else "smallest"
    return f"Find the {word} of {', '.join(map(str, numbers))}.", steps, best


def _digit_sum(rng: random.Random, difficulty: int) -> Generated:
    length = {1: 3, 2: 5, 3: 7}[difficulty]
    number = rng.randint(10 ** (length - 1), 10**length - 1)
    digits = [int(d) for d in str(number)]
    steps, answer = _chain_steps(digits[0], [("+", d) for d in digits[1:]])
    return f"Sum the digits of {number}.", steps, answer


def _x_term(coefficient: int) -> str:
    """``3x``, or ``x`` for a coefficient of 1."""
    return "x" if coefficient == 1 else f"{coefficient}x"


def _signed(value: int) -> str:
    """``+5`` / ``-5``: how a constant follows an x term."""
    return f"+{value}" if value >= 0 else str(value)


def _move(total: int, constant: int) -> str:
    """``total - constant`` written as it reads: ``22-7`` or ``-31+13``."""
    return f"{total}-{constant}" if constant > 0 else f"{total}+{-constant}"


def _linear_eq(rng: random.Random, difficulty: int) -> Generated:
    if difficulty == 1:
        a, x, b = rng.randint(2, 9), rng.randint(0, 20), rng.randint(1, 30)
    elif difficulty == 2:
        a, x, b = rng.randint(2, 12), rng.randint(-20, 20), rng.randint(-50, 50)
    else:
        a, x, b = rng.randint(4, 12), rng.randint(-15, 15), rng.randint(-30, 30)
    if b == 0:
        raise _Reject
    if difficulty < 3:
        c = a * x + b
        question = f"Solve {a}x{_signed(b)}={c}."
        steps = [f"{a}x={_move(c, b)}={c - b}", f"x={c - b}/{a}={x}"]
        return question, steps, x
    c = rng.randint(1, a - 2)  # x on both sides; the coefficient left, a - c, is >= 2
    k = a - c
    d = k * x + b
    if d == 0:
        raise _Reject
    question = f"Solve {a}x{_signed(b)}={_x_term(c)}{_signed(d)}."
    steps = [f"{a}x-{_x_term(c)}={k}x", f"{k}x={_move(d, b)}={d - b}", f"x={d - b}/{k}={x}"]
    return question, steps, x


def _fraction_of(rng: random.Random, difficulty: int) -> Generated:
    if difficulty == 1:
        denominator = rng.randint(2, 12)
        numerator = rng.randint(1, denominator - 1)
        if gcd(numerator, denominator) != 1:
            raise _Reject
        quotient = rng.randint(2, 30)
        whole = denominator * quotient
        question = f"Find {numerator}/{denominator} of {whole}."
        steps = []
    else:
        if difficulty == 2:
            percent = 5 * rng.randint(1, 19)
        else:
            percent = rng.randint(1, 99)
            if percent % 5 == 0:
                raise _Reject
        fraction = Fraction(percent, 100)
        numerator, denominator = fraction.numerator, fraction.denominator
        quotient = rng.randint(2, 50) if difficulty == 2 else rng.randint(2, 15)
        whole = denominator * quotient
        question = f"Find {percent}% of {whole}."
        steps = [f"{percent}%={numerator}/{denominator}"]
    steps.append(f"{whole}/{denominator}={quotient}")
    answer = quotient * numerator
    if numerator > 1:
        steps.append(f"{quotient}*{numerator}={answer}")
    return question, steps, answer


class _Reject(Exception):
    """A draw the generator does not use (internal; the caller draws again)."""


_GENERATORS: dict[str, Callable[[random.Random, int], Generated]] = {
    "add_sub": _add_sub,
    "multiply": _multiply,
    "order_of_ops": _order_of_ops,
    "modulo": _modulo,
    "max_min": _max_min,
    "digit_sum": _digit_sum,
    "linear_eq": _linear_eq,
    "fraction_of": _fraction_of,
}


# --- drawing problems -----------------------------------------------------------------------


def _check_family(family: str) -> None:
    if family not in _GENERATORS:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")


def _check_difficulty(difficulty: int) -> None:
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")


def _draw(
    family: str, difficulty: int, rng: random.Random, *, held_out: bool, problem_id: str
) -> Problem:
    """The first draw of ``rng`` that is valid, fits the length limits and is in the split."""
    generator = _GENERATORS[family]
    for _ in range(_MAX_ATTEMPTS):
        try:
            question, steps, answer = generator(rng, difficulty)
        except _Reject:
            continue
        solution = "\n".join([*steps, f"\\boxed{{{answer}}}"])
        prompt = format_prompt(question)
        if (
            is_held_out(question) != held_out
            or len(prompt) > MAX_PROMPT_CHARS
            or len(solution) > MAX_SOLUTION_CHARS
            or len(prompt) + len(solution) > MAX_EXAMPLE_CHARS
        ):
            continue
        return Problem(family, question, solution, str(answer), difficulty, problem_id)
    raise RuntimeError(f"no valid {family} problem at difficulty {difficulty} drawn")


def generate(family: str, n: int, seed: int, *, difficulty: int | None = None) -> list[Problem]:
    """``n`` training problems of ``family`` (never held-out ones), deterministic in ``seed``.

    ``difficulty`` fixes the level; None draws each problem's level uniformly.
    Problems may repeat (the easy levels have a few thousand distinct questions).
    """
    _check_family(family)
    if difficulty is not None:
        _check_difficulty(difficulty)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = _rng("generate", family, seed, difficulty)
    problems = []
    for index in range(n):
        level = difficulty if difficulty is not None else rng.choice(DIFFICULTIES)
        problem_id = f"{family}-s{seed}-{index:06d}"
        problems.append(_draw(family, level, rng, held_out=False, problem_id=problem_id))
    return problems


def training_mix(
    n: int,
    seed: int,
    *,
    families: Iterable[str] = FAMILIES,
    difficulties: Iterable[int] = DIFFICULTIES,
) -> list[Problem]:
    """The tiny DeepScaleR: ``n`` training problems, family and difficulty uniform per item.

    Never contains a held-out question. Deterministic in ``seed``.
    """
    families, difficulties = tuple(families), tuple(difficulties)
    if not families or not difficulties:
        raise ValueError("training_mix needs at least one family and one difficulty")
    for family in families:
        _check_family(family)
    for difficulty in difficulties:
        _check_difficulty(difficulty)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = _rng("training_mix", seed, families, difficulties)
    problems = []
    for index in range(n):
        family, difficulty = rng.choice(families), rng.choice(difficulties)
        problem_id = f"mix-s{seed}-{index:06d}"
        problems.append(_draw(family, difficulty, rng, held_out=False, problem_id=problem_id))
    return problems


_LAST_RESULT = re.compile(r"=(-?\d+)$")


def with_wrong_last_step(problem: Problem, rng: random.Random) -> Problem:
    """``problem`` with a slip in its last step: the final answer ``v`` becomes ``v + d``, ``d``
    drawn uniformly from -9..-1, 1..9, written both where the last step states its result
    (a trailing ``=v``; ``max_min``'s comparisons state none) and in the box. The steps
    before it stay right, so a model taught a share of these still computes the right answer
    and writes a wrong one some of the time: a base that knows more than it says (issue 46).
    The problem's ``answer`` stays the right one; its id gains ``-slip``."""
    value = int(problem.answer)
    wrong = value + rng.choice([d for d in range(-9, 10) if d])
    *steps, _boxed = problem.solution.split("\n")
    if steps:
        match = _LAST_RESULT.search(steps[-1])
        if match and int(match.group(1)) == value:
            steps[-1] = steps[-1][: match.start(1)] + str(wrong)
    solution = "\n".join([*steps, f"\\boxed{{{wrong}}}"])
    return replace(problem, solution=solution, id=f"{problem.id}-slip")


def derived_seed(*parts: object) -> int:
    """A seed that depends only on ``parts`` (the run seed, the step, a round, a name): a
    step's problems are ``training_mix(n, derived_seed(seed, step, round))`` on both backends."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:7], "little")


# --- the held-out evaluation sets -----------------------------------------------------------


def make_eval_set(family: str) -> list[Problem]:
    """The held-out evaluation set of ``family``, as committed in ``data/tiny_eval``.

    ``EVAL_ITEMS_PER_DIFFICULTY`` distinct held-out questions per difficulty, in
    difficulty order, ids ``<family>-000`` onwards.
    """
    _check_family(family)
    problems: list[Problem] = []
    for difficulty in DIFFICULTIES:
        rng = _rng("eval", family, difficulty, EVAL_SEED)
        seen: set[str] = set()
        for _ in range(_MAX_ATTEMPTS):
            if len(seen) == EVAL_ITEMS_PER_DIFFICULTY:
                break
            problem_id = f"{family}-{len(problems):03d}"
            problem = _draw(family, difficulty, rng, held_out=True, problem_id=problem_id)
            if problem.question not in seen:
                seen.add(problem.question)
                problems.append(problem)
        else:
            raise RuntimeError(f"{family} difficulty {difficulty}: too few held-out questions")
    return problems


def _to_jsonl(problems: Sequence[Problem]) -> str:
    return "".join(json.dumps(p.to_record(), ensure_ascii=True) + "\n" for p in problems)


def write_eval_sets(directory: str | Path | None = None) -> list[Path]:
    """Regenerate every ``<family>.jsonl`` in ``directory`` (default ``EVAL_DIR``)."""
    target = Path(directory) if directory is not None else EVAL_DIR
    target.mkdir(parents=True, exist_ok=True)
    paths = []
    for family in FAMILIES:
        path = target / f"{family}.jsonl"
        path.write_text(_to_jsonl(make_eval_set(family)), encoding="utf-8")
        logger.info("wrote %s", path)
        paths.append(path)
    return paths


def load_eval_set(family: str, directory: str | Path | None = None) -> list[Problem]:
    """The committed evaluation set of ``family`` (``<directory>/<family>.jsonl``)."""
    _check_family(family)
    path = (Path(directory) if directory is not None else EVAL_DIR) / f"{family}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found; regenerate with `python scripts/make_tiny_eval.py`"
        )
    problems = []
    for line_number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            problem = Problem.from_record(json.loads(line))
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(f"{path}:{line_number}: {error}") from error
        if problem.family != family:
            raise ValueError(f"{path}:{line_number}: family {problem.family!r} in {family} file")
        problems.append(problem)
    return problems
