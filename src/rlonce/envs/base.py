"""The Environment contract. An environment is used once (no reset) for one sequence.

A task is data — frozen, picklable, able to travel between processes; the environment is the
behaviour built around it: a sandbox, tools, a grader.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rlonce.core import faults
from rlonce.core.records import FailureCategory, Grade, Sequence, Status
from rlonce.core.timeouts import Clock, Expired, within
from rlonce.errors import POLICY, blame, cause_of, is_internal, note_internal
from rlonce.sandbox.base import Sandbox

if TYPE_CHECKING:
    from pydantic import BaseModel


class GradingError(Exception):
    """Grading could not produce a verdict. Never a low reward: the sequence becomes an
    infrastructure failure of ``category``."""

    category: FailureCategory = FailureCategory.GRADER_UNAVAILABLE


async def grade_or_infra(env, seq: Sequence, clock: Clock | None = None) -> Grade | None:
    """``env.grade(seq)``; a grader that cannot give a verdict makes ``seq`` an infrastructure
    failure (its category from ``GradingError``) and the grade ``None`` — never a low score.
    A grader that cannot handle what the policy left (``blame`` says ``POLICY``: a
    ``PolicyInputError`` such as a hostile path, text that does not decode) gives the policy's
    failed attempt instead: ``failed_grade`` (the environment's own, if it has one), graded and
    trained. With ``clock``, grading runs within its reward limit and the rest of the trajectory."""
    try:
        faults.point("grade", GradingError)
        grade = await (env.grade(seq) if clock is None else clock.reward(env.grade(seq)))
        if not isinstance(grade, Grade):
            raise TypeError(f"{type(env).__name__}.grade returned {type(grade).__name__}, not a Grade")
        return grade
    except GradingError as e:
        seq.status, seq.failure, seq.cause = Status.INFRA, e.category, cause_of(e)
    except Exception as e:  # noqa: BLE001 - a grader outage is not the model's failure
        if blame(e, infrastructure=(Expired, GradingError), tool_call=False) == POLICY:
            env.metrics["policy_input_errors"] = env.metrics.get("policy_input_errors", 0.0) + 1
            return failed_grade(env, cause_of(e))
        seq.status, seq.failure, seq.cause = Status.INFRA, *infra_failure(e, FailureCategory.GRADER_UNAVAILABLE)
    return None


def failed_grade(env, why: str) -> Grade:
    """The grade of an attempt the grader could not take: ``env.failed_grade(why)`` where the
    environment defines what a failed attempt earns, else reward 0 and ``passed`` false."""
    own = getattr(env, "failed_grade", None)
    return own(why) if own is not None else Grade(0.0, passed=False,
                                                  transcript=f"the grader could not take the attempt: {why}")


def infra_failure(e: BaseException, category: FailureCategory) -> tuple[FailureCategory, str]:
    """The failure category and cause for ``e``: ``internal_error`` when ``e`` is a bug in
    rlonce (noted for the test suite), the expired layer's for a timeout (``Expired``), else
    ``category``."""
    if is_internal(e):
        return FailureCategory.INTERNAL_ERROR, note_internal(e)
    return (e.category if isinstance(e, Expired) else category), cause_of(e)


class Task(Protocol):
    task_id: str
    source: str


class Environment(Protocol):
    """Everything the product uses of an environment (the harness loop, ``run_sequence``, the
    outside harness, the evaluator). Built by a domain's ``env_factory(task)``, used for one
    sequence: ``setup`` → prompts and tools → ``call_tool`` … → ``grade`` → ``cleanup``."""

    task: Task
    metrics: dict[str, float]
    """Measurements for the sequence (copied into ``Sequence.metrics`` at the end); may be empty."""

    async def setup(self) -> None: ...

    def system_prompt(self) -> str: ...

    def user_prompt(self) -> str: ...

    def tools(self) -> list[dict]:
        """The environment's own tools as function schemas (an arm may translate them)."""

    async def call_tool(self, name: str, arguments: dict) -> str: ...

    async def grade(self, sequence: Sequence) -> Grade:
        """The reward and the explicit pass flag; raise ``GradingError`` when no verdict can be
        given (never a low score)."""

    async def cleanup(self) -> None: ...


@runtime_checkable
class HasWorkspace(Protocol):
    """An optional capability: the environment works in a sandbox whose ``workspace`` folder an
    outside harness can run over (``rlonce eval --harness-cmd``). Tool-less environments
    (reasoning) do not have one."""

    sandbox: Sandbox


@dataclass(frozen=True)
class Checkout:
    """A task's own workspace, for a grader that works on it as an agent (``rlonce.grading.agentic``)."""

    sandbox: Callable[[], Sandbox]
    """A new sandbox whose workspace holds the task's starting state and whatever its checks need;
    ``SandboxError`` or ``OSError`` when it cannot be built (the grading episode is then an
    infrastructure failure, never a verdict)."""
    note: str
    """Where the workspace is, for the grader's system prompt: "/work holds the task and the
    attempts to grade, <note>"."""
    check: str = ""
    """A shell command, run in the workspace, that checks it (a scripted grader runs it); '' none."""


@runtime_checkable
class HasCheckout(Protocol):
    """An optional capability of a task: it can lay out its own workspace for a grader (the code
    domain's buggy repository with its test runner). A task without it, or whose ``checkout()``
    is None, gives the grader an empty workspace holding only the files it is shown."""

    def checkout(self) -> Checkout | None: ...


class GroupGrader(Protocol):
    """An optional hook for graders that compare attempts: an environment class (or the function
    a ``functools.partial`` env factory wraps) with ``grade_group`` is called once per group,
    after every sibling finished and was graded alone, with the siblings that did not fail in
    the infrastructure. It may set each one's grade (``Sequence.set_grade``) and ``metrics``; an exception makes the
    whole group an infrastructure failure with its cause."""

    @staticmethod
    async def grade_group(task: Task, sequences: list[Sequence]) -> None: ...


class Answer(Protocol):
    """A judge's answer to one question: ``ok`` with a ``value`` of the asked schema, or not ok."""

    value: BaseModel | None

    @property
    def ok(self) -> bool: ...


@runtime_checkable
class JudgeBinding(Protocol):
    """A judge bound to its model (an endpoint, or a script): what graders call on it — the run's
    group grader (``rlonce.grading.graders``), the domains that ask a judge themselves (the visual
    pick, the general domain's judged items) and the offline task audit and rubric writer.
    ``rlonce.grading.judge.Judge`` and its subclasses are the built-in ones; it sits here, below
    ``rlonce.grading``, so environments can name it."""

    name: str
    """The judge's name in records (``RUN/grading/<name>.jsonl``)."""
    model: str
    """The model (or script) it asks."""

    async def ask(self, prompt: str, schema: type[BaseModel], *, kind: str, sample: int = 0, task=None,
                  files: dict[str, str] | None = None, images: Iterable[tuple[str, bytes]] = ()) -> Answer:
        """A verdict of ``schema`` on ``prompt`` (a question of ``kind``; ``sample`` > 0: an
        independent draw; ``task`` and ``files``: a workspace for an agentic grader; ``images``:
        (label, bytes) pairs shown with it). Never raises for what the endpoint does."""

    def take_counts(self) -> dict[str, float]:
        """Its calls, failures and tokens since the last call, as ``judge_*`` metrics; then zeroed."""


def group_grader(env_factory) -> Callable | None:
    """``env_factory``'s ``grade_group`` hook, if it has one (see ``GroupGrader``)."""
    return getattr(getattr(env_factory, "func", env_factory), "grade_group", None)


async def grade_group_or_infra(env_factory, task, sequences: list[Sequence], reward_timeout: float | None = None
                               ) -> None:
    """Run ``env_factory``'s group hook over the siblings that finished, within ``reward_timeout``
    seconds; a hook that raises makes them infrastructure failures (``grader_unavailable``,
    ``reward_timeout``, or ``internal_error`` for our bug)."""
    hook = group_grader(env_factory)
    live = [s for s in sequences if not s.infra_failed]
    if hook is None or not live:
        return
    try:
        await within(hook(task, live), reward_timeout, FailureCategory.REWARD_TIMEOUT)
    except Exception as e:  # noqa: BLE001 - a grader outage is not the model's failure
        failure, cause = infra_failure(e, FailureCategory.GRADER_UNAVAILABLE)
        for s in live:
            s.status, s.failure, s.cause = Status.INFRA, failure, cause
            s.set_grade(None)


def function_tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    """A tool definition in the JSON-schema form chat templates and the OpenAI API use."""
    return {
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required},
    }
