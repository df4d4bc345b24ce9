"""One limit on GPU counts (issue 41 item 9; Note: [GPU counts] in fakeviz._core.gpus): a machine has at most
MAX_GPUS GPUs, a parallel job at most MAX_RANKS ranks, however the job is written."""

from __future__ import annotations

import pytest

import fakeviz as fv
from fakeviz._core.errors import ArgumentError
from fakeviz._core.gpus import MAX_GPUS, MAX_RANKS, parse_gpus, read_gpus
from fakeviz._frontends.parallel import parse_parallel


def test_a_job_of_128_gpus_reads_the_same_written_either_way() -> None:
    by_count = parse_parallel({"dp_shard": 128}, "128xH100")
    by_kind = parse_parallel({"dp_shard": 128}, "H100")
    assert by_count == by_kind and by_count[0] == (128,)
    assert parse_parallel({"dp_shard": 16, "tp": 8}, ["128xH100"]) == parse_parallel({"dp_shard": 16, "tp": 8}, "H100")
    # fv.plan reads gpus= as a job's when parallel= is given: 128 GPUs against 64 ranks is the mismatch it names
    with pytest.raises(ValueError, match=r"holds 128 GPUs, but parallel=\{'dp_shard': 64\} makes 64 ranks"):
        fv.plan("gpt2", gpus="128xH100", parallel={"dp_shard": 64})


def test_a_device_map_over_more_than_one_machine_is_refused_with_the_job_to_write() -> None:
    with pytest.raises(ArgumentError) as e:
        fv.plan("gpt2", gpus="128xH100")
    first, advice = str(e.value).split("\n", 1)
    assert first == f"gpus='128xH100': 128 GPUs; a fake machine has between 1 and {MAX_GPUS} GPUs"
    assert "gpus='128xH100', parallel={'dp_shard': 128}" in advice
    assert len(parse_gpus(f"{MAX_GPUS}xH100")) == MAX_GPUS  # one machine's full count is a device map's


def test_one_rank_limit_for_every_way_of_writing_a_job() -> None:
    over = MAX_RANKS + 1
    said = f"{over} GPUs; a parallel job has between 1 and {MAX_RANKS:,} ranks"
    errors = []
    for call in (
        lambda: parse_parallel({"dp_shard": over}, "H100"),  # the degrees
        lambda: parse_parallel({"dp_shard": 1}, f"{over}xH100"),  # the GPUs named
        lambda: fv.simulate(lambda rank, mesh: None, over),  # a step of one's own
    ):
        with pytest.raises(ArgumentError) as e:
            call()
        errors.append(str(e.value).split("\n")[0])
    assert all(x.endswith(f": {said}") for x in errors), errors
    assert errors[0].startswith("parallel=") and errors[1].startswith("gpus=") and errors[2].startswith("world_size=")
    assert read_gpus(f"{MAX_RANKS}xH100", job=True)[0] == MAX_RANKS


def test_a_simulation_of_more_ranks_than_one_machine_has_devices() -> None:
    sim = fv.simulate(lambda rank, mesh: None, 2 * MAX_GPUS, ranks=[0, 2 * MAX_GPUS - 1])
    assert sim.world_size == 2 * MAX_GPUS and sim.device_of(2 * MAX_GPUS - 1) == "cuda:7"
    said = f"^gpus_per_node=65: 65 GPUs; a fake machine has between 1 and {MAX_GPUS}"
    with pytest.raises(ArgumentError, match=said):
        fv.simulate(lambda rank, mesh: None, 130, gpus_per_node=65)
