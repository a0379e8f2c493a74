"""The reference corpus and its statistics: ``python -m rlonce.envs.music.reference`` rewrites
``reference.json`` (shipped in the package, so grading needs no corpus at run time).

Provenance: the corpus is ``CORPUS_SIZE`` tunes written by ``rlonce.envs.music.compose`` from
random requests under the seed ``CORPUS_SEED``, which no task or expert uses. It is a generated
folk-style corpus, not a collection of existing music: the feature score therefore measures
closeness to this generator's style (the seed's scorer measures closeness to its baseline corpus
in the same way, and its provenance was not audited either). The tunes are converted with the
installed abc2midi on the host (the text is our own, not a policy's).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from rlonce.envs.music.abc import require_abc2midi
from rlonce.envs.music.compose import compose, random_request
from rlonce.envs.music.features import FEATURES, HIST_BINS, histograms, measure, read_midi

CORPUS_SEED = 90_210
CORPUS_SIZE = 240
PATH = Path(__file__).with_name("reference.json")


def corpus(n: int = CORPUS_SIZE, seed: int = CORPUS_SEED) -> list[str]:
    rng = random.Random(seed)
    return [compose(rng, random_request(rng), f"Reference {i}") for i in range(n)]


def midi_of(abc: str) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "t.abc", Path(d) / "t.mid"
        src.write_text(abc)
        subprocess.run([require_abc2midi(), str(src), "-o", str(out)], capture_output=True, timeout=60, check=True)
        return out.read_bytes()


def build(n: int = CORPUS_SIZE, seed: int = CORPUS_SEED) -> dict:
    scores = [read_midi(midi_of(t)) for t in corpus(n, seed)]
    rows = [measure(s) for s in scores]
    values = {f: np.array([r[f] for r in rows], float) for f in FEATURES}
    hists = [histograms(s) for s in scores]
    return {
        "provenance": f"{n} tunes from rlonce.envs.music.compose, seed {seed} (python -m rlonce.envs.music.reference)",
        "tunes": n,
        "percentiles": {f: [round(float(np.percentile(v, q)), 6) for q in (10, 50, 90)] for f, v in values.items()},
        "histograms": {h: [round(float(x), 6) for x in np.mean([hh[h] for hh in hists], axis=0)] for h in HIST_BINS},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Rebuild the music reference statistics.")
    ap.add_argument("--out", default=str(PATH))
    args = ap.parse_args(argv)
    Path(args.out).write_text(json.dumps(build(), indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
