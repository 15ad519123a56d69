"""What a stage of the plan reads and returns: the plan's inputs, the plan so far, and one stage's step.

A stage (policy/plan/stages.py) is a function `(PlanInputs, Draft) -> Step`: its decisions, the speed questions the
calibration may time for it, and the structured choices later stages read (the backend, the thread plan, the GGUF
blocks, the model source). policy/plan/plan.py runs the stages in order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

from service.facts.draft_model import DraftFacts
from service.facts.hardware import HardwareFacts
from service.facts.libraries import LibraryFacts
from service.facts.model import ModelFacts
from service.facts.software import SoftwareFacts
from service.facts.vllm_source import VllmNames
from service.policy.gguf.model_source import BlocksChoice, ModelSourcePlan
from service.policy.machine.backend import BackendChoice
from service.policy.machine.backends import Backend
from service.policy.machine.threads import ThreadPlan
from service.policy.plan.calibration import Question, Verdict
from service.policy.plan.decision import PolicyResult
from service.settings import Settings


@dataclass(frozen=True)
class PlanInputs:
    """Everything the plan is a function of."""

    hardware: HardwareFacts
    model: ModelFacts | None
    software: SoftwareFacts
    settings: Settings
    environ: Mapping[str, str]
    libraries: LibraryFacts | None = None  # None: not read, no preload decision
    vllm_names: VllmNames | None = None  # None: not read, architectures and quantization methods not checked
    known_as: str | None = None  # the name the model was asked for by (the demo's, a hub id), if not a path
    default_model: bool = False  # the packaged default model (no model configured)
    verdicts: Mapping[str, Verdict] | None = None  # the calibration's, per decision (None: not calibrated)
    draft_model: DraftFacts | None = None  # the directory the speculative setting names (a draft model, an EAGLE head)

    @cached_property
    def user(self) -> frozenset[str]:
        """The settings the user set (theirs win over the policy's)."""
        return self.settings.explicitly_set()

    def verdict(self, decision: str) -> Verdict | None:
        return (self.verdicts or {}).get(decision)


@dataclass(frozen=True, kw_only=True)
class Step(PolicyResult):
    """One stage's decisions and questions, and the structured choices it makes for the stages after it."""

    questions: tuple[Question, ...] = ()
    backend: BackendChoice | None = None
    threads: ThreadPlan | None = None
    backend_own: PolicyResult | None = None  # the backend's own settings as its table decides them, before calibration
    blocks: BlocksChoice | None = None
    source: ModelSourcePlan | None = None
    final: bool = False  # nothing after this step can be planned (no usable backend)

    @classmethod
    def of_result(cls, result: PolicyResult, **choices: object) -> Step:
        return cls(decisions=result.decisions, warnings=result.warnings, errors=result.errors, **choices)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Draft:
    """The plan so far: every step's decisions in stage order, the questions, and the structured choices."""

    results: tuple[PolicyResult, ...] = ()
    questions: tuple[Question, ...] = ()
    backend: BackendChoice | None = None
    threads: ThreadPlan | None = None
    backend_own: PolicyResult = field(default_factory=PolicyResult)
    blocks: BlocksChoice | None = None
    source: ModelSourcePlan | None = None

    def after(self, step: Step) -> Draft:
        choices = {
            name: value
            for name in ("backend", "threads", "backend_own", "blocks", "source")
            if (value := getattr(step, name)) is not None
        }
        return replace(
            self,
            results=(*self.results, PolicyResult(step.decisions, step.warnings, step.errors)),
            questions=self.questions + step.questions,
            **choices,
        )

    @property
    def merged(self) -> PolicyResult:
        return PolicyResult.merge(self.results)

    @property
    def entry(self) -> Backend:
        assert self.backend is not None and self.backend.entry is not None, "the backend stage runs first"
        return self.backend.entry

    @property
    def thread_plan(self) -> ThreadPlan:
        assert self.threads is not None, "the threads stage runs first"
        return self.threads

    @property
    def dtype(self) -> str:
        return str(self.merged.engine_args["dtype"])

    @property
    def kept_blocks(self) -> str | None:
        """The type a GGUF file's linear layers keep (choose_blocks), or None."""
        return self.blocks.type_name if self.blocks else None


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[PlanInputs, Draft], Step]
    needs_model: bool = False  # skipped when there is no model (detect without one)
    always: bool = False  # runs after a refusal too (what the port and vLLM's processes would do is still shown)
