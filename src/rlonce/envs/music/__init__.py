"""music: ABC tunes for generated requests, single turn or with tools (needs abcmidi)."""

from pydantic import Field

from rlonce.config.domains import DomainOptions, DomainSpec, Probe, need_module, need_program


class MusicOptions(DomainOptions):
    adherence_weight: float = Field(0.5, ge=0, le=1)
    """Reward = (1 - w) x feature score + w x request adherence; 0 is the seed's public scorer
    exactly (it never checks the request)."""
    max_bars: int = Field(24, ge=8, le=24)
    """The longest tune a request asks for (requests draw 8, 12, 16 or 24 bars up to it)."""


def _task(max_bars: int, split: str, index: int):
    from rlonce.envs.music.tasks import make_task

    return make_task(split, index, max_bars=max_bars)


def build(o: MusicOptions):
    from functools import partial

    from rlonce.envs.domains import Domain
    from rlonce.envs.music.env import MusicEnv
    from rlonce.envs.music.expert import expert_turns

    env = partial(MusicEnv, adherence_weight=o.adherence_weight)
    return Domain("music", env, partial(_task, o.max_bars), expert=expert_turns)


DOMAIN = DomainSpec(
    name="music", build=build, options=MusicOptions, has_expert=True, single_turn=True,
    summary="compose an ABC tune for a request; scored on MIDI features and adherence (needs abcmidi)",
    needs=lambda o: [need_program("abc2midi", "abcmidi", "the music grader converts ABC to MIDI with it"),
                     need_module("pretty-midi", "pretty_midi", "the music grader reads MIDI")],
    probe=Probe(run="rlonce.envs.music.probe:run_probe", format_report="rlonce.envs.music.probe:format_report",
                reads=("tasks",)))
