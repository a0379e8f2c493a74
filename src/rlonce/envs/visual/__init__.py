"""visual: web pages written by the policy, rendered by headless Chromium and graded on the pixels."""

from typing import Literal

from rlonce.config.domains import DomainOptions, DomainSpec, Probe, need_module, need_program


class VisualOptions(DomainOptions):
    visual_family: Literal["replication", "open", "mixed"] = "replication"
    """'replication' (reproduce a generated reference page; pixel SSIM and structural checks),
    'open' (design requests scored by the group pick judge; needs ``grading.judge.vision``) or
    'mixed' (every third train task open). Held-out evaluation uses replication tasks."""
    visual_layouts: Literal["full", "simple"] = "full"
    """Replication layouts — 'full' (optional bar and footer; cards, table, form or banner) or
    'simple' (a heading and a banner or cards: fewer parts, a shorter page for small models)."""


def build(o: VisualOptions):
    from rlonce.config import ConfigError
    from rlonce.envs.domains import Domain
    from rlonce.envs.visual.expert import expert_turns
    from rlonce.envs.visual.factory import VisualFactory
    from rlonce.envs.visual.render import require_browser
    from rlonce.envs.visual.tasks import make_task

    require_browser()  # a one-line error naming the package, before any rollout starts
    family = o.visual_family

    def make(split: str, index: int):
        # held-out evaluation grades attempts alone: only replication tasks can be scored that way
        return make_task(split, index, family="replication" if split == "heldout" else family,
                         layouts=o.visual_layouts)

    def attach(run_dir, judge_for) -> Domain:
        judge = None
        if family != "replication":
            judge, vision = judge_for("visual-judge")
            if judge is None or not vision:
                raise ConfigError(f"visual_family = {family!r} needs a vision-capable judge: set grading.judge "
                                  "(kind, base_url, model) and grading.judge.vision = true, or use 'replication'")
        return Domain("visual", VisualFactory(shots_dir=run_dir / "visual" if run_dir else None, judge=judge),
                      make, single_turn=True, expert=expert_turns)

    return Domain("visual", VisualFactory(), make, single_turn=True, expert=expert_turns, attach=attach)


DOMAIN = DomainSpec(
    name="visual", build=build, options=VisualOptions, has_expert=True, single_turn=True,
    summary="write a web page; rendered by Chromium, graded on pixels and structure (needs chromium)",
    needs=lambda o: [need_program("chromium", "chromium", "the visual grader renders pages with it"),
                     need_module("playwright", "playwright", "drives Chromium for the visual grader")],
    probe=Probe(run="rlonce.envs.visual.probe:run_probe", format_report="rlonce.envs.visual.probe:format_report",
                reads=("tasks",)))
