"""A job that fills its own directory on the node (the job-state tmpfs) is evicted, once, with the reason."""

from __future__ import annotations

import os
from pathlib import Path

from executors.node.job_dir_cap import JobDirCap, dir_usage

MIB = 1024**2


def _fill(d: Path, mib: int) -> None:
    with open(d / "iteration.json", "wb") as f:  # written, not sparse: blocks allocated
        f.write(os.urandom(mib * MIB))


def test_attack_a_job_filling_its_directory_is_evicted_once(tmp_path: Path) -> None:
    for sid in (7, 8):
        (tmp_path / str(sid)).mkdir()
    _fill(tmp_path / "7", 9)
    (tmp_path / "8" / "iteration.json").write_text("{}")
    running = [(0, 70, 7), (1, 80, 8)]
    cap = JobDirCap(tmp_path, lambda: running, cap_bytes=8 * MIB)
    [over] = cap.once()
    assert (over.gpu_index, over.job_id, over.slurm_job_id) == (0, 70, 7)
    assert "holds 9.0 MiB (at most 8 MiB)" in over.reason
    assert cap.once() == []  # evicted once; its requeue ends the job


def test_many_small_files_count_too_and_links_are_not_followed(tmp_path: Path) -> None:
    d = tmp_path / "7"
    d.mkdir()
    for i in range(20):
        (d / f"f{i}").touch()
    big = tmp_path / "elsewhere"
    big.mkdir()
    _fill(big, 2)
    (d / "link").symlink_to(big)
    used, entries = dir_usage(d, max_entries=100)
    assert entries == 21 and used < MIB
    [over] = JobDirCap(tmp_path, lambda: [(0, None, 7)], max_entries=10).once()
    assert "more than 10 entries" in over.reason


def test_jobs_not_placed_here_and_missing_directories_are_left_alone(tmp_path: Path) -> None:
    (tmp_path / "9").mkdir()
    _fill(tmp_path / "9", 2)
    assert JobDirCap(tmp_path, lambda: [(0, 1, 7)], cap_bytes=MIB).once() == []


def test_attack_a_subdirectory_swapped_for_a_link_after_the_listing_is_not_followed(tmp_path: Path, monkeypatch) -> None:
    """The job swaps its subdirectory for a link to one of root's between root's listing and its descent."""
    d = tmp_path / "7"
    (d / "sub").mkdir(parents=True)
    roots = tmp_path / "roots"
    roots.mkdir()
    _fill(roots, 2)
    real = os.scandir
    swapped = []

    class Swapping:
        def __init__(self, target):
            self.it = real(target)

        def __enter__(self):
            return self.it.__enter__()

        def __exit__(self, *exc):
            out = self.it.__exit__(*exc)
            if not swapped:  # right after the top directory was listed: the job's move
                (d / "sub").rmdir()
                (d / "sub").symlink_to(roots)
                swapped.append(True)
            return out

    monkeypatch.setattr(os, "scandir", Swapping)
    used, entries = dir_usage(d)
    assert swapped and entries == 1 and used < MIB  # the link was not walked into
