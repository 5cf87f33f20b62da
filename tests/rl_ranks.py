"""A LightningRL run whose update is data parallel on every rank torchrun starts (tests/test_rl_distributed.py):

    torchrun --standalone --nproc-per-node 2 tests/rl_ranks.py OUT MODEL_DIR

The same script on every rank, as a user writes it: rank 0's ``fit`` runs the loop, the other ranks' ``fit`` follows
(``LightningRL.follows``). Each rank writes what its ``fit`` returned to ``OUT/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import agl
from agl.trainers.config import ServingConfig
from agl.trainers.rl import LightningRL, LightningRLConfig, UpdateConfig
from tests.test_rl_e2e import MAX_TOKENS, TASKS, capital_agent


def main() -> None:
    out, model_dir = Path(sys.argv[1]), Path(sys.argv[2])
    cfg = LightningRLConfig(
        model_dir=model_dir,
        rounds=2,
        group_size=4,
        serving=ServingConfig(max_tokens=MAX_TOKENS, temperature=0.25),
        update=UpdateConfig(lr=1e-2, device="cpu", strategy="ddp"),
        seed=0,
        checkpoint_dir=out / "checkpoints",
    )
    trainer = agl.Trainer(algorithm=LightningRL(cfg), n_runners=1, store=f"sqlite:///{out / 'agl.db'}", progress=False)
    result = trainer.fit(capital_agent, TASKS)
    served = result.resources is not None
    rank = os.environ["RANK"]
    (out / f"rank{rank}.json").write_text(json.dumps({"metrics": result.metrics, "resources": served}))


if __name__ == "__main__":
    main()
