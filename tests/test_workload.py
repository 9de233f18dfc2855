import json

import numpy as np
import pytest

from cbsim.config.schema import WorkloadConfig
from cbsim.workload import Request, check_requests_fit, make_requests


def test_fixed_offline_default_shape():
    w = WorkloadConfig(batch_size=32, prompt_len=256, gen_len=8192)
    reqs = make_requests(w, 128256)
    assert len(reqs) == 32
    assert [r.rid for r in reqs] == list(range(32))
    assert all(r.prompt_len == 256 and r.max_new_tokens == 8192 for r in reqs)
    assert all(r.arrival_s == 0.0 for r in reqs)
    ids = np.concatenate([r.prompt_ids for r in reqs])
    assert ids.min() >= 0 and ids.max() < 128256
    assert ids.dtype in (np.int32, np.int64)


def test_prompt_ids_are_one_draw_of_the_seed_s_stream_whoever_reads_first():
    """The ids are drawn on first read (a simulation never reads them), all at once: reading
    the last request first gives every request the ids the eager draw gave."""
    w = WorkloadConfig(num_requests=30, prompt_dist="uniform", prompt_spread=0.5, seed=3)
    reqs = make_requests(w, 1000)
    backwards = [r.prompt_ids for r in reversed(reqs)][::-1]
    stream = np.random.default_rng(np.random.SeedSequence(3).spawn(4)[3])
    eager = stream.integers(0, 1000, size=sum(r.prompt_len for r in reqs), dtype=np.int32)
    assert np.array_equal(np.concatenate(backwards), eager)
    assert [ids.size for ids in backwards] == [r.prompt_len for r in reqs]
    longer = reqs[4].with_max_new_tokens(reqs[4].max_new_tokens + 1)
    assert np.array_equal(longer.prompt_ids, backwards[4])
    assert (longer.rid, longer.arrival_s) == (reqs[4].rid, reqs[4].arrival_s)


def test_deterministic_and_seed_dependent():
    w = WorkloadConfig(
        num_requests=20, prompt_dist="uniform", prompt_spread=0.5, arrival="poisson", rate=5.0
    )
    a, b = make_requests(w, 1000), make_requests(w, 1000)
    assert all(
        x.prompt_len == y.prompt_len
        and x.arrival_s == y.arrival_s
        and np.array_equal(x.prompt_ids, y.prompt_ids)
        for x, y in zip(a, b)
    )
    c = make_requests(
        WorkloadConfig(
            num_requests=20,
            prompt_dist="uniform",
            prompt_spread=0.5,
            arrival="poisson",
            rate=5.0,
            seed=1,
        ),
        1000,
    )
    assert [r.prompt_len for r in a] != [r.prompt_len for r in c]


def test_uniform_bounds():
    w = WorkloadConfig(
        num_requests=500,
        prompt_len=100,
        prompt_dist="uniform",
        prompt_spread=0.2,
        gen_len=10,
        gen_dist="uniform",
        gen_spread=0.9,
    )
    reqs = make_requests(w, 50)
    p = np.array([r.prompt_len for r in reqs])
    g = np.array([r.max_new_tokens for r in reqs])
    assert p.min() >= 80 and p.max() <= 120 and p.min() < 85 and p.max() > 115
    assert g.min() >= 1 and g.max() <= 19


def test_lognormal_mean():
    w = WorkloadConfig(
        num_requests=20000, prompt_len=400, prompt_dist="lognormal", prompt_spread=0.6
    )
    p = np.array([r.prompt_len for r in make_requests(w, 10)])
    assert p.min() >= 1
    assert abs(p.mean() / 400 - 1) < 0.03  # value is the mean


def test_poisson_arrivals():
    w = WorkloadConfig(num_requests=4000, arrival="poisson", rate=50.0, prompt_len=4, gen_len=2)
    t = np.array([r.arrival_s for r in make_requests(w, 10)])
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert abs(np.diff(t).mean() * 50 - 1) < 0.06


def test_length_file_lines_and_json(tmp_path):
    lines = tmp_path / "p.txt"
    lines.write_text("5\n# comment\n\n7\n")
    js = tmp_path / "g.json"
    js.write_text(json.dumps([3, 0]))
    w = WorkloadConfig(num_requests=5, prompt_dist="file", prompt_file=str(lines))
    assert [r.prompt_len for r in make_requests(w, 10)] == [5, 7, 5, 7, 5]
    w = WorkloadConfig(num_requests=2, gen_dist="file", gen_file=str(js))
    with pytest.raises(ValueError, match=r"g\.json.*entry 2 is 0"):
        make_requests(w, 10)
    js.write_text(json.dumps([3, 4]))
    assert [r.max_new_tokens for r in make_requests(w, 10)] == [3, 4]


def test_length_file_errors(tmp_path):
    missing = tmp_path / "nope.txt"
    w = WorkloadConfig(num_requests=2, prompt_dist="file", prompt_file=str(missing))
    with pytest.raises(ValueError, match="nope.txt"):
        make_requests(w, 10)
    bad = tmp_path / "bad.txt"
    bad.write_text("12\nabc\n")
    w = WorkloadConfig(num_requests=2, prompt_dist="file", prompt_file=str(bad))
    with pytest.raises(ValueError, match="bad.txt.*entry 2"):
        make_requests(w, 10)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    w = WorkloadConfig(num_requests=2, prompt_dist="file", prompt_file=str(empty))
    with pytest.raises(ValueError, match="no lengths"):
        make_requests(w, 10)


def test_check_requests_fit():
    ok = Request(0, 0.0, np.zeros(10, dtype=np.int32), 6)
    check_requests_fit([ok], max_context=16, kv_capacity_tokens=15)  # the last output is not fed
    long = Request(7, 0.0, np.zeros(10, dtype=np.int32), 7)
    with pytest.raises(ValueError, match=r"request 7.*17 tokens.*context of 16"):
        check_requests_fit([ok, long], max_context=16, kv_capacity_tokens=100)
    with pytest.raises(ValueError, match=r"request 7.*needs 16 KV entries.*capacity of 15"):
        check_requests_fit([ok, long], max_context=100, kv_capacity_tokens=15)


def test_a_lengths_file_is_checked_whenever_it_is_named(tmp_path):
    from cbsim.config.errors import ConfigError
    from cbsim.workload import check_lengths_files

    good = tmp_path / "ok.txt"
    good.write_text("5\n7\n")
    # named without prompt_dist=file: refused, saying what is allowed (not silently ignored)
    with pytest.raises(ConfigError, match=r"workload.prompt_file=.*ok.txt is set but "):
        WorkloadConfig(num_requests=2, prompt_file=str(good))
    big = tmp_path / "big.json"
    big.write_text(json.dumps([5, 1 << 30]))
    w = WorkloadConfig(num_requests=2, gen_dist="file", gen_file=str(big))
    with pytest.raises(
        ConfigError,
        match=r"workload.gen_file=.*big.json: entry 2 is 1073741824; "
        r"allowed: lengths from 1 to 16777216",
    ):
        check_lengths_files(w)
    obj = tmp_path / "obj.json"
    obj.write_text('[{"a": 1}]')
    w = WorkloadConfig(num_requests=2, gen_dist="file", gen_file=str(obj))
    with pytest.raises(ConfigError, match="entry 1 .* is not an integer"):
        check_lengths_files(w)
    w = WorkloadConfig(num_requests=2, gen_dist="file", gen_file=str(tmp_path / "nope.txt"))
    with pytest.raises(ConfigError, match="workload.gen_file=.*nope.txt: cannot read"):
        check_lengths_files(w)
    check_lengths_files(WorkloadConfig(num_requests=2, prompt_dist="file", prompt_file=str(good)))
