"""mode=runtime refuses what cannot run before anything is built or written: one line naming
the key, exit 2, no traceback."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import run_cli  # noqa: E402

from cbsim.config.errors import ConfigError  # noqa: E402
from cbsim.runtime.engine import execute  # noqa: E402

CPU = ["mode=runtime", "mode.device=cpu", "model=tiny"]


def test_runtime_compare_on_a_cpu_fails_before_the_sync_run(tmp_path):
    # engine=compare on a CPU must not run the whole sync half first (minutes for a real
    # workload) and only then refuse the async half, which needs CUDA
    run_dir = tmp_path / "job"
    r = run_cli(
        [*CPU, "engine=compare", "workload.batch_size=2", "workload.gen_len=4",
         f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    assert "needs CUDA" in r.stderr
    assert not list(run_dir.glob("trace*")), "nothing may run on a config that cannot finish"


def test_runtime_prompt_over_the_budget_fails_before_the_model_is_built(tmp_path):
    # a drawn prompt longer than max_batch_tokens with chunked prefill off can never run
    r = run_cli(
        [*CPU, "engine=sync", "workload.batch_size=4", "workload.gen_len=4",
         "workload.prompt_len=256", "workload.prompt_dist=lognormal",
         "workload.prompt_spread=1.0", "workload.chunked_prefill=false",
         "workload.max_batch_tokens=300", f"hydra.run.dir={tmp_path / 'job'}"],
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    assert "cbsim: config error" in r.stderr and "max_batch_tokens" in r.stderr
    assert "Traceback" not in r.stderr


def test_async_with_one_io_slot_is_refused_naming_the_key(config_factory):
    # the simulator shows what one slot does to the async loop (the overwrite hazard); the real
    # engine never overwrites inputs still being read, so runtime mode refuses the config
    with pytest.raises(ConfigError, match="engine.io_slots=1"):
        config_factory([*CPU, "engine=async", "engine.io_slots=1"])


def test_a_run_that_does_not_fit_the_device_is_refused_before_building(config_factory):
    # the 70B shape's 140 GB of weights: refused from the estimate against the memory of the
    # device it runs on (on a CPU the host RAM available), not after minutes of building them
    config = config_factory(
        ["mode=runtime", "mode.device=cpu", "engine=sync", "model=llama3_70b",
         "workload.batch_size=2", "workload.gen_len=4", "hardware.memory_bytes=1e15"]
    )  # fmt: skip
    with pytest.raises(ConfigError, match="device memory") as info:
        execute(config, "sync")
    assert "RAM available (mode.device=cpu)" in str(info.value)
