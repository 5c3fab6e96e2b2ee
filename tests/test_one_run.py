"""A folder of per-rank reports is checked for being one run (issue 44: four unrelated exports
were read as "training … on 5 ranks"): unrelated exports are one line naming the report that
does not belong, or, asked for, shown side by side, never merged as ranks. On real exports:
the bundled per-rank captures (one run each), the public corpus (unrelated programs), and
mutated copies where a rule needs a job identity that no bundled capture records."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tests.conftest import NSYS_CORPUS, SAMPLES, mutated_copy, run_capture
from tracekit.errors import UnrelatedReportsError
from tracekit.multi import open_many, rank_identity
from tracekit.runs import _command, unrelated_reason

PER_RANK = SAMPLES / "llm_tp2_nccl_per_rank"
CORPUS4 = ["nsys2022.2_pipit_saxpy_mpi_cuda", "nsys2023.1_memfusion_tensorrt", "nsys2024.5_pipit_cloverleaf_4xa100",
           "nsys2026.1_nsysai_mock"]


def _link_folder(folder: Path, files: list[Path]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        (folder / f.name).symlink_to(f)
    return folder


@pytest.fixture(scope="module")
def fsdp2() -> Path:
    return run_capture("train_fsdp2_2gpu")


@pytest.fixture(scope="module")
def corpus4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _link_folder(tmp_path_factory.mktemp("corpus4") / "four", [NSYS_CORPUS / f"{n}.sqlite" for n in CORPUS4])


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory, fsdp2: Path) -> Path:
    """The two ranks of the TP=2 decode, and rank 0 of an FSDP2 training captured a week later."""
    return _link_folder(tmp_path_factory.mktemp("mixed") / "mixed",
                        [*sorted(PER_RANK.glob("*.sqlite")), fsdp2 / "train_fsdp2_2gpu_rank0.sqlite"])


def test_bundled_per_rank_captures_are_one_run(fsdp2: Path) -> None:
    for folder, source in ((PER_RANK, "env:RANK"), (fsdp2, "nccl")):
        ts = open_many(folder, max_workers=1)
        assert ts.unrelated is None, folder
        assert ts.ranks.select("rank", "rank_source").rows() == [(0, source), (1, source)]
        assert ts.kernels["rank"].null_count() == 0
        assert ts.reports["offset_ns"].max() > 0  # the second rank moved onto the first one's clock


def test_unrelated_exports_are_one_line_naming_the_odd_one(corpus4: Path) -> None:
    with pytest.raises(UnrelatedReportsError) as err:
        open_many(corpus4, max_workers=1)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"{corpus4}: the reports are not one run: nsys2023.1_memfusion_tensorrt.sqlite was captured at "
                           "2023-07-30 09:30:32 UTC, 34 days apart from nsys2022.2_pipit_saxpy_mpi_cuda.sqlite")
    assert "3 of the 4 reports differ" in text and "--side-by-side" in text and "allow_unrelated=True" in text


def test_the_report_that_does_not_belong_is_named(mixed: Path) -> None:
    """Two ranks of one run and a third capture: the third is the odd one out (the pair agrees)."""
    with pytest.raises(UnrelatedReportsError, match=r"not one run: train_fsdp2_2gpu_rank0.sqlite was captured at "
                                                    r"2026-11-28 08:58:31 UTC, 7 days apart from llm_tp2_nccl_per_rank_rank0"):
        open_many(mixed, max_workers=1)


def test_runs_of_another_program_and_old_exports(tmp_path: Path) -> None:
    # two 2-rank trainings of one script with another --mode, one 4.6 s after the other ended
    ddp, exposed = run_capture("train_ddp_2gpu") / "train_ddp_2gpu.sqlite", run_capture("train_ddp_exposed_2gpu") / "train_ddp_exposed_2gpu.sqlite"
    with pytest.raises(UnrelatedReportsError, match=r"not one run: train_ddp_(exposed_)?2gpu.sqlite was captured at "
                                                    r"2026-11-28 08:5\d:\d\d UTC, 4.6 s apart from train_ddp"):
        open_many([ddp, exposed], max_workers=1)
    # exports of nsys ≤ 2021 record no session start and no command: their nsys versions differ
    with pytest.raises(UnrelatedReportsError, match="nsys2021.2_mordred_report1.sqlite was captured by nsys 2021.x, "
                                                    "nsys2020.5_kmeans_report2.sqlite by nsys 2020.5"):
        open_many([NSYS_CORPUS / "nsys2020.5_kmeans_report2.sqlite", NSYS_CORPUS / "nsys2021.2_mordred_report1.sqlite"],
                  max_workers=1)
    # the same capture twice under two names
    rank0 = PER_RANK / "llm_tp2_nccl_per_rank_rank0.sqlite"
    twice = _link_folder(tmp_path / "twice", [rank0])
    (twice / "again_rank1.sqlite").symlink_to(rank0)
    with pytest.raises(UnrelatedReportsError, match="are the same capture"):
        open_many(twice, max_workers=1)


def test_job_identity_and_world_size(tmp_path: Path) -> None:
    """Rules on the job's identity, on mutated copies of the TP=2 ranks (no bundled capture ran
    under a scheduler): another SLURM job is another run even when captured together; a shared
    job id keeps ranks whose clocks are far apart one run; another WORLD_SIZE is another run."""
    r0, r1 = (PER_RANK / f"llm_tp2_nccl_per_rank_rank{r}.sqlite" for r in (0, 1))
    job = "INSERT INTO META_DATA_CAPTURE (name, value) VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', 'SLURM_JOB_ID=\"{}\"')"
    folder = tmp_path / "jobs"
    folder.mkdir()
    mutated_copy(r0, folder / "a_rank0.sqlite", job.format(41))
    mutated_copy(r1, folder / "a_rank1.sqlite", job.format(42))
    with pytest.raises(UnrelatedReportsError, match=r"a_rank1.sqlite belongs to job SLURM_JOB_ID=42, a_rank0.sqlite to 41"):
        open_many(folder, max_workers=1)
    # one job, the second node's clock an hour off: one run
    mutated_copy(r1, folder / "a_rank1.sqlite", job.format(41),
                 "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = utcEpochNs + 3600000000000")
    ts = open_many(folder, max_workers=1)
    assert ts.unrelated is None and ts.ranks["rank"].to_list() == [0, 1]
    mutated_copy(r1, folder / "a_rank1.sqlite", "UPDATE META_DATA_CAPTURE SET value = 'WORLD_SIZE=\"4\"' WHERE value = 'WORLD_SIZE=\"2\"'")
    with pytest.raises(UnrelatedReportsError, match=r"a_rank1.sqlite is one of 4 ranks \(WORLD_SIZE\), a_rank0.sqlite one of 2"):
        open_many(folder, max_workers=1)


def test_identity_of_a_rank() -> None:
    trace = tracekit.open(PER_RANK / "llm_tp2_nccl_per_rank_rank1.sqlite")
    _, ident = rank_identity(trace, trace.path)
    assert ident.command == ("python3", "decode.py", "--tp", "2", "--steps", "8")
    assert ident.ranks == {1} and ident.world_size == 2 and ident.host == "vm"
    assert ident.devices == {"7d3df7a6-9705-854f-8f37-ead3bea9e4fd"}  # the GPU its kernels ran on, of the two listed
    assert ident.start_utc_ns == trace.meta.session_epoch_ns + trace.meta.start_ns
    assert ident.job == {}  # TORCHELASTIC_RUN_ID=none names no job
    # rank arguments differ between the ranks of one run; the rest of the command may not
    assert _command(["torchrun", "--node_rank", "1", "--nnodes=2", "t.py", "--local-rank=3"]) == ("torchrun", "--nnodes=2", "t.py")
    other = dataclasses.replace(ident, path=Path("x_rank0.sqlite"), ranks=frozenset({0}), devices=frozenset({"gpu0"}),
                                command=("python3", "decode.py", "--tp", "4"))
    assert unrelated_reason([ident, other]) == ("the reports are not one run: x_rank0.sqlite ran `python3 decode.py --tp 4`, "
                                                "llm_tp2_nccl_per_rank_rank1.sqlite `python3 decode.py --tp 2 --steps 8`")
    same_gpu = dataclasses.replace(ident, path=Path("y.sqlite"), ranks=frozenset(), pids=frozenset({1}))
    assert "ran on the same GPU(s) of host vm" in str(unrelated_reason([dataclasses.replace(ident, ranks=frozenset()), same_gpu]))


def test_side_by_side_is_never_merged_as_ranks(mixed: Path) -> None:
    from tracekit.diagnosis import diagnose, structure

    ts = open_many(mixed, max_workers=1, allow_unrelated=True)
    assert ts.unrelated is not None and "train_fsdp2_2gpu_rank0.sqlite" in ts.unrelated
    assert ts.ranks["rank"].null_count() == 3 and set(ts.ranks["rank_source"]) == {"side by side"}
    assert ts.kernels["rank"].null_count() == ts.kernels.height > 0
    assert ts.reports["offset_ns"].to_list() == [0, 0, 0]  # each report on its own clock
    alone = tracekit.open(mixed / "train_fsdp2_2gpu_rank0.sqlite")
    assert ts.kernels.filter(pl.col("report") == 2)["start_ns"].to_list() == alone.kernels["start_ns"].to_list()
    for analysis in (diagnose, structure):
        with pytest.raises(UnrelatedReportsError, match=r"^the diagnosis reads several reports as the ranks of one run, "
                                                        r"and these are not \(.*\); look at each report on its own"):
            analysis(ts)
    assert "side by side" in repr(ts)
    # reports of one run, allowed unrelated: a set of ranks as ever
    assert open_many(PER_RANK, max_workers=1, allow_unrelated=True).ranks["rank"].to_list() == [0, 1]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "tracekit.cli.main", *args], capture_output=True, text=True, check=False,
                          env=env, timeout=600)


def test_cli_refuses_in_one_line_and_compares_side_by_side(mixed: Path, corpus4: Path, tmp_path: Path) -> None:
    for args in (["summary", str(corpus4)], ["diagnose", str(mixed)], ["report", str(mixed), "-o", str(tmp_path / "r.html")],
                 ["export", "perfetto", str(mixed), "-o", str(tmp_path / "t.pftrace")],
                 ["diff", str(mixed), str(PER_RANK)]):
        run = _cli(*args)
        assert run.returncode == 2, (args, run.stderr)
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tracekit: error: ") and "not one run" in lines[0], (args, run.stderr)
        assert not (tmp_path / "r.html").exists() and not (tmp_path / "t.pftrace").exists()
    side = _cli("summary", "--side-by-side", "--top", "2", "--findings", "1", str(corpus4))
    assert side.returncode == 0, side.stderr
    assert "4 reports side by side (not ranks of one run)" in side.stdout
    for name in CORPUS4:
        assert f"top kernels: {name}.sqlite" in side.stdout
    assert "saxpy" in side.stdout and "par_ranged2d_kernel" in side.stdout  # each report's own kernels
    js = _cli("diagnose", "--side-by-side", "-f", "json", str(mixed))
    assert js.returncode == 0, js.stderr
    out = json.loads(js.stdout)
    assert out["side_by_side"] is True and [Path(r["path"]).name for r in out["reports"]] == sorted(p.name for p in mixed.iterdir())
    alone = tracekit.diagnose(tracekit.open(mixed / "train_fsdp2_2gpu_rank0.sqlite")).to_dict()
    assert out["reports"][2]["diagnosis"]["findings"][0]["title"] == alone["findings"][0]["title"]


def test_reduced_on_dask_is_checked_too(mixed: Path) -> None:
    pytest.importorskip("distributed")
    with pytest.raises(UnrelatedReportsError, match="not one run: train_fsdp2_2gpu_rank0.sqlite"):
        tracekit.open_many(mixed, engine="dask", max_workers=1)
