"""The config tree composes, and bad input fails before anything runs, naming the key."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import compose_cfg, make_config, run_cli
from hydra.core.override_parser.overrides_parser import OverridesParser

from cbsim.config import CbsimConfig, ConfigError
from cbsim.config.values import replace_values

GROUP_OPTIONS = {
    "mode": ["sim", "runtime"],
    "model": ["llama3_8b", "llama3_1b", "llama3_70b", "tiny"],
    "hardware": ["h200", "h100"],
    "engine": ["sync", "async", "compare"],
}


def test_default_config_is_typed_and_valid():
    cfg = make_config()
    assert isinstance(cfg, CbsimConfig)
    assert cfg.mode.name == "sim" and cfg.engine.name == "async"
    assert cfg.model.kv_bytes_per_token == 128 * 1024  # BRIEF: 128 KiB per token for 8B
    assert abs(cfg.model.weight_bytes - 16.06e9) / 16.06e9 < 0.01  # BRIEF: 16.06 GB


@pytest.mark.parametrize(
    "group,option", [(g, o) for g, opts in GROUP_OPTIONS.items() for o in opts]
)
def test_every_preset_composes(group, option):
    cfg = make_config([f"{group}={option}"])
    assert getattr(cfg, group).name == option


# Each: overrides, a fragment the message must contain (the key and/or the allowed values).
BAD_VALUES = [
    (["workload.batch_size=-1"], "workload.batch_size"),
    (["workload.batch_size=0"], "workload.batch_size"),
    (["workload.gen_len=0"], "workload.gen_len"),
    (["workload.prompt_len=-5"], "workload.prompt_len"),
    (["workload.gen_dist=zipf"], "allowed: fixed, uniform, lognormal, file"),
    (["workload.arrival=bursty"], "allowed: offline, poisson"),
    (["workload.arrival=poisson", "workload.rate=0"], "workload.rate"),
    (["workload.gen_dist=file"], "workload.gen_file"),
    (["workload.prompt_dist=uniform", "workload.prompt_spread=1.5"], "workload.prompt_spread"),
    (["workload.max_batch_tokens=16"], "workload.max_batch_tokens"),
    (["workload.chunked_prefill=false", "workload.prompt_len=10000"], "chunked_prefill"),
    (["workload.kv_block_size=0"], "workload.kv_block_size"),
    (["engine.io_slots=3"], "engine.io_slots"),
    (["engine.eager_token_multiple=0"], "engine.eager_token_multiple"),
    (["engine.streams=four"], "allowed: three, one, default"),
    (
        ["engine.graph_memsets=drop"],
        "engine.graph_memsets=drop is not an option; allowed: kernels, keep",
    ),
    (["engine.carry_over=false"], "engine.carry_over"),
    (["engine.graph_batch_sizes=[]"], "engine.graph_batch_sizes"),
    (["mode=runtime", "engine.io_slots=1"], "engine.io_slots=1"),
    (["mode=runtime", "engine.streams=default"], "engine.streams=default"),
    # the runtime's async half of a comparison always used two slots and always waited on
    # events: these what-ifs were accepted there and silently ignored
    (["mode=runtime", "engine=compare", "engine.io_slots=1"], "engine.io_slots=1"),
    (["mode=runtime", "engine.event_waits=false"], "engine.event_waits=false"),
    (["model.num_kv_heads=5"], "model.num_kv_heads"),
    (["model.dtype=int4"], "allowed: bfloat16, float16, float32"),
    (["model=tiny", "workload.gen_len=5000"], "model.max_position_embeddings"),
    (["hardware.hbm_bandwidth=0"], "hardware.hbm_bandwidth"),
    (["hardware.gpu.gemm_bandwidth_eff=1.5"], "hardware.gpu.gemm_bandwidth_eff"),
    (["hardware.host.prepare.fixed_us=-1"], "hardware.host.prepare.fixed_us"),
    (["task=train"], "allowed: run, calibrate, validate"),
    (["mode.attention=magic"], "mode.attention"),
    # accepted by the config, then a traceback from the runtime after the model was built
    (["mode.attention=flex"], "allowed: auto, torch, triton"),
    (["mode=runtime", "mode.device=cpu", "mode.attention=triton"], "mode.attention=triton"),
]


@pytest.mark.parametrize("overrides,fragment", BAD_VALUES)
def test_bad_values_name_the_key(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        make_config(overrides)
    assert fragment in str(err.value)


# Type errors and unknown keys are caught by Hydra/OmegaConf while composing.
BAD_TYPES = [
    (["workload.batch_size=abc"], "workload.batch_size"),
    (["workload.chunked_prefill=maybe"], "workload.chunked_prefill"),
    (["workload.batchsize=32"], "batchsize"),
    (["+workload.colour=red"], "colour"),
    (["engine=turbo"], "turbo"),
    (["model.hidden_size=1.5"], "model.hidden_size"),
]


@pytest.mark.parametrize("overrides,fragment", BAD_TYPES)
def test_bad_types_and_unknown_keys_fail_while_composing(overrides, fragment):
    with pytest.raises(Exception) as err:
        make_config(overrides)
    assert fragment in str(err.value) or fragment in str(err.value.__cause__)


def test_one_stream_is_a_what_if_of_both_back_ends():
    for mode in ("sim", "runtime"):
        cfg = make_config([f"mode={mode}", "engine=compare", "engine.streams=one"])
        assert cfg.engine.streams == "one"


def test_cli_config_error_is_a_message_not_a_traceback(tmp_path):
    result = run_cli(["workload.batch_size=-3"], cwd=tmp_path)
    assert result.returncode == 2
    assert "workload.batch_size=-3" in result.stderr
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.rglob("trace.json*")), "nothing may run on a bad config"


def test_cli_unknown_group_option_lists_choices(tmp_path):
    result = run_cli(["engine=turbo"], cwd=tmp_path)
    assert result.returncode != 0
    assert "sync" in result.stderr and "async" in result.stderr


def test_cfg_job_shows_composed_config(tmp_path):
    result = run_cli(["--cfg", "job", "engine=sync", "workload.batch_size=8"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "batch_size: 8" in result.stdout and "name: sync" in result.stdout


def test_help_fits_a_screen_lists_groups_and_points_to_cfg_job(tmp_path):
    (tmp_path / "profiles" / "hardware").mkdir(parents=True)
    (tmp_path / "profiles" / "hardware" / "my_gpu.yaml").write_text("defaults:\n  - h200\n")
    env = {**os.environ, "CBSIM_CONFIG_DIR": str(tmp_path / "profiles")}
    result = subprocess.run(
        [sys.executable, "-m", "cbsim", "--help", "workload.batch_size=8"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) <= 45, result.stdout
    assert "--cfg job" in result.stdout and "cbsim.report" in result.stdout
    groups = result.stdout.split("== Config groups ==")[1].split("== Config ==")[0]
    assert "engine: async, compare, sync" in groups and "+experiment: " in groups
    assert "_schema" not in groups, "only options a user can choose"
    assert "my_gpu" in groups, "hardware profiles are listed as Hydra finds them"
    assert "workload.batch_size=8" in groups, "the keys show this command line's values"


def test_compose_keeps_overrides():
    cfg = compose_cfg(["workload.gen_len=8192", "engine=sync"])
    assert cfg.workload.gen_len == 8192 and cfg.engine.name == "sync"


# Values as a grid point sets them (cbsim.config.values) take what Hydra's composition takes and
# refuse what it refuses, with the same result.
BY_VALUE = [
    "workload.batch_size=8.0",
    "model.name=3",
    "workload.ignore_eos=1",
    "workload.ignore_eos=0",
    "workload.ignore_eos=yes",
    "workload.rate=5",
    "workload.rate='2.5'",
    "workload.rate=abc",
    "workload.seed=true",
    "workload.batch_size='16'",
    "workload.batch_size=-3",
    "workload.num_requests=null",
    "model.name=true",
    "engine.graph_batch_sizes=[1,2,4]",
    "hardware.gpu.carry_over_us=nan",
]


@pytest.mark.parametrize("override", BY_VALUE)
def test_a_value_set_on_a_built_config_is_what_hydra_composes(override):
    (parsed,) = OverridesParser.create().parse_overrides([override])
    try:
        want = make_config([override])
    except Exception:
        want = None
    try:
        got = replace_values(make_config(), {parsed.key_or_group: parsed.value()})
    except ConfigError:
        got = None
    assert got == want


@pytest.mark.parametrize(
    "override", ["extra.reported.sync_total_s=1.5", "extra.reported=7", "extra.nope=1"]
)
def test_an_extra_value_set_on_a_built_config_is_what_hydra_composes(override):
    (parsed,) = OverridesParser.create().parse_overrides([override])
    try:
        want = make_config(["+experiment=seed_repro", override])
    except Exception:
        want = None
    base = make_config(["+experiment=seed_repro"])
    try:
        got = replace_values(base, {parsed.key_or_group: parsed.value()})
    except ConfigError:
        got = None
    assert got == want
