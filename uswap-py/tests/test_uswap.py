"""uswap's Python package against the real engine: real userfaultfd, real files, real threads.

Every test checks contents or counters. Sizes are tens of MiB with budgets of 8-16 MiB, so
the data is several times the budget and really swaps.
"""

import ctypes
import gc
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import uswap

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[2]


def handler_name():
    """The name of numpy's current data-memory handler (NEP 49)."""
    try:
        from numpy._core.multiarray import get_handler_name
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import get_handler_name
    return get_handler_name()


def managed_workload(n):
    """Sequential integer work, a sort, a small random gather and a matrix product over
    arrays of n elements: exact (or nearly, for the product), so results compare equal."""
    x = (np.arange(n, dtype=np.int64) * 2654435761) % (1 << 31)
    y = (x * 3 + 7) % 1000003
    z = np.cumsum(np.sort(y))
    g = y[x[: 1 << 14] % n]  # random reads: each may fault a page back in
    side = 1024
    m = (x[: side * side].reshape(side, side) % 1000).astype(np.float64)
    prod = m @ m.T
    return z, g, prod


def test_numpy_computation_over_4x_the_limit_matches_plain_numpy_and_swaps():
    limit = 8 * MiB
    n = 4 * MiB  # int64: 32 MiB per array, 4x the limit, several arrays at once
    expect_z, expect_g, expect_prod = managed_workload(n)
    pager = uswap.Pager(limit=limit, devices="zpool:512MiB", fault_mode="thread")
    with pager.numpy():
        assert handler_name() == "uswap"
        z, g, prod = managed_workload(n)
        during = pager.stats()
    assert handler_name() != "uswap", "the previous handler is back after the block"
    assert np.array_equal(z, expect_z)
    assert np.array_equal(g, expect_g)
    assert np.allclose(prod, expect_prod, rtol=1e-12, atol=0)
    st = pager.stats()
    assert st["pswpout"] * uswap.PAGE_SIZE > 4 * n * 8, st
    assert st["numpy_allocs"] >= 6, st
    assert st["numpy_blocks"] == 2, "z and prod live in managed memory (g is below the threshold)"
    assert during["numpy_bytes"] == n * 8 + 8 * MiB, "z and prod, whole pages"
    assert st["resident_peak_pages"] * uswap.PAGE_SIZE <= limit + 4 * MiB, st
    del z, g, prod
    gc.collect()
    st = pager.stats()
    assert st["numpy_blocks"] == 0 and st["numpy_bytes"] == 0, st
    assert st["resident_pages"] == 0, "freed arrays leave nothing resident"
    assert sum(d["slots_used"] for d in st["devices"]) == 0, "freed arrays leave no swap slots"


def test_region_viewed_by_numpy_is_read_and_written_from_several_threads(pager):
    region = pager.map(32 * MiB)  # 4x the 8 MiB budget
    a = np.frombuffer(region, dtype=np.uint64)
    assert a.ctypes.data == region.address, "zero-copy: the array is the region's memory"
    assert not a.any(), "a new region reads as zero"
    nr_threads = 4
    stripe = a.size // nr_threads
    barrier = threading.Barrier(nr_threads, timeout=60)
    errors = []

    def work(t):
        try:
            part = a[t * stripe : (t + 1) * stripe]
            idx = np.arange(t * stripe, (t + 1) * stripe, dtype=np.uint64)
            for rnd in range(3):
                part[:] = idx * np.uint64(2654435761) + np.uint64(rnd)
                assert np.array_equal(part, idx * np.uint64(2654435761) + np.uint64(rnd))
            barrier.wait()
            # Read the neighbour's stripe, written by another thread and paged out meanwhile.
            u = (t + 1) % nr_threads
            idx = np.arange(u * stripe, (u + 1) * stripe, dtype=np.uint64)
            other = a[u * stripe : (u + 1) * stripe]
            assert np.array_equal(other, idx * np.uint64(2654435761) + np.uint64(2))
        except Exception as e:  # reported below, with the thread's number
            errors.append((t, repr(e)))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(nr_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
        assert not th.is_alive(), "a thread is stuck touching the region (no progress in 120 s)"
    assert not errors, errors
    idx = np.arange(a.size, dtype=np.uint64)
    assert np.array_equal(a, idx * np.uint64(2654435761) + np.uint64(2)), "every word, after all threads"
    st = pager.stats()
    assert st["pswpout"] > 0 and st["pswpin"] > 0, st


def test_np_save_and_load_of_managed_arrays_round_trip(pager, tmp_path):
    n = 4 * MiB  # 32 MiB of int64, 4x the budget
    path = tmp_path / "a.npy"
    with pager.numpy():
        a = np.arange(n, dtype=np.int64) * 7 + 3
        np.save(path, a)  # write(2) from managed memory, much of it swapped out
        b = np.load(path)  # read(2) into managed memory
    assert pager.stats()["numpy_blocks"] == 2
    assert np.array_equal(b, np.arange(n, dtype=np.int64) * 7 + 3)
    assert path.stat().st_size >= n * 8
    # A region viewed by numpy goes through the same system calls.
    region = pager.map(n * 8)
    view = np.frombuffer(region, dtype=np.int64)
    view[:] = b[::-1]
    np.save(tmp_path / "r.npy", view)
    assert np.array_equal(np.load(tmp_path / "r.npy"), np.arange(n, dtype=np.int64)[::-1] * 7 + 3)
    with open(path, "rb") as f:
        f.seek(128)  # past the .npy header, the array's bytes
        got = f.readinto(memoryview(region)[: n * 8])
    assert got == n * 8
    assert np.array_equal(view, a), "readinto straight into the region"
    assert pager.stats()["pswpout"] > 0


def test_releasing_a_region_with_live_views_raises_and_the_last_view_unmaps_it(pager):
    region = pager.map(4 * MiB)
    arr = np.frombuffer(region, dtype=np.uint8)
    arr[:] = 0xA5
    mv = memoryview(region)
    with pytest.raises(BufferError, match="2 exported buffer"):
        region.release()
    mv.release()
    with pytest.raises(BufferError, match="1 exported buffer"):
        region.release()
    assert (arr == 0xA5).all(), "a refused release leaves the memory as it was"
    # Dropping the region object keeps it mapped while the array lives.
    del region
    gc.collect()
    arr[::4096] = 7
    assert (arr[::4096] == 7).all() and (arr[1::4096] == 0xA5).all()
    assert pager.stats()["resident_pages"] > 0
    del arr
    gc.collect()
    assert pager.stats()["resident_pages"] == 0, "the last view unmapped the region"
    # An explicit release with no views unmaps at once; the object then refuses exports.
    r2 = pager.map(MiB)
    memoryview(r2)[:4] = b"abcd"
    assert bytes(memoryview(r2)[:4]) == b"abcd"
    r2.release()
    assert r2.released
    with pytest.raises(BufferError, match="released"):
        memoryview(r2)
    r2.release()  # twice is allowed
    with pager.map(MiB) as r3:
        assert len(r3) == MiB
    assert r3.released
    assert pager.stats()["resident_pages"] == 0


def test_bad_sizes_raise_uswap_errors_with_the_engines_message(pager):
    cases = [
        (lambda: uswap.Pager(limit="2XB"), 'unknown size unit "XB"'),
        (lambda: uswap.Pager(limit="1.2.3GiB"), "is not a number"),
        (lambda: uswap.Pager(limit=-1), "a size cannot be negative"),
        (lambda: uswap.Pager(limit=1 << 70), "more than any machine's memory"),
        (lambda: uswap.Pager(limit="1KiB"), "below the minimum of 1048576 bytes"),
        (lambda: uswap.Pager(limit=8 * MiB, devices="tape"), 'unknown device kind "tape"'),
        (lambda: uswap.Pager(limit=8 * MiB, devices="ram:1KiB"), "below one cluster"),
        (lambda: uswap.Pager(limit=8 * MiB, fault_mode="poll"), 'fault_mode "poll"'),
        (lambda: uswap.Pager(limit=8 * MiB, handler_threads=-1), "handler_threads=-1 cannot serve faults"),
        (lambda: uswap.Pager(limit=8 * MiB, handler_threads=1 << 70), "a pager starts at most"),
        (lambda: pager.map(0), "cannot map a region of zero bytes"),
        (lambda: pager.map("1.5ZiB"), 'unknown size unit "ZiB"'),
        (lambda: pager.map(1 << 62), "MAX_REGION_BYTES"),
        (lambda: pager.set_limit("12"), "below the minimum"),
        (lambda: pager.numpy(threshold=[1]), "expected a size"),
    ]
    for call, message in cases:
        with pytest.raises(uswap.InvalidArgumentError) as info:
            call()
        assert isinstance(info.value, uswap.Error)
        assert isinstance(info.value, ValueError), "code written for any library catches it"
        assert message in str(info.value), (message, str(info.value))
    assert pager.limit == 8 * MiB, "a refused limit leaves the old one"
    with pytest.raises(OSError, match="swap device") as info:
        uswap.Pager(limit=8 * MiB, devices="file:/proc/no/such/dir:64MiB")
    assert type(info.value) is uswap.DeviceError
    for name, builtin in (("OutOfMemoryError", MemoryError), ("IoError", OSError), ("LimitError", None)):
        cls = getattr(uswap, name)
        assert issubclass(cls, uswap.Error) and cls.__module__ == "uswap" and cls.__doc__, name
        assert builtin is None or issubclass(cls, builtin), (name, builtin)


def skip(why):
    """Skips the test, or fails it where no test may skip (`.ci/run` sets USWAP_TEST_NO_SKIP:
    CI installs every prerequisite)."""
    if os.environ.get("USWAP_TEST_NO_SKIP"):
        pytest.fail(f"SKIPPED where no test may skip (USWAP_TEST_NO_SKIP): {why}")
    pytest.skip(why)


def test_unavailable_userfaultfd_raises_uswap_error():
    """As an unprivileged user with vm.unprivileged_userfaultfd=0 and a root-only
    /dev/userfaultfd, the kernel refuses both ways of opening a userfaultfd."""
    if os.geteuid() != 0:
        skip("needs root, to run the child as an unprivileged user")
    if Path("/proc/sys/vm/unprivileged_userfaultfd").read_text().strip() != "0":
        skip("vm.unprivileged_userfaultfd=1: every user may open a userfaultfd")
    dev = Path("/dev/userfaultfd")
    if dev.exists() and dev.stat().st_mode & 0o006:
        skip("/dev/userfaultfd is open to every user")
    child = textwrap.dedent(
        """
        import os, uswap
        os.setgroups([])
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)  # drops every capability
        try:
            uswap.Pager(limit="8MiB", devices="ram:64MiB", fault_mode="thread")
        except uswap.UserfaultfdError as e:
            print("UserfaultfdError", isinstance(e, uswap.Error), e)
        else:
            print("no error")
        """
    )
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("UserfaultfdError True cannot open a userfaultfd"), out.stdout + out.stderr
    assert "vm.unprivileged_userfaultfd=1" in out.stdout, "the message says how to grant access"


def test_signal_mode_with_the_syscall_guard_receives_datagrams_into_pages_that_are_out():
    """In a fresh interpreter (one thread, as the guard needs): datagrams received with
    recv_into into pages of a region 4x the limit that went out, every byte checked; and,
    before that, a pager asking for the guard while another thread runs is refused, saying
    what to do."""
    child = textwrap.dedent(
        """
        import os, socket, threading, time, uswap
        MiB = 1 << 20
        stop = threading.Event()
        t = threading.Thread(target=stop.wait)
        t.start()
        try:
            uswap.Pager(limit=4 * MiB, devices="ram:16MiB", fault_mode="signal", syscall_guard=True)
            print("built")
        except uswap.Error as e:
            print("refused" if "one thread" in str(e) else "other: %s" % e)
        stop.set()
        t.join()
        for _ in range(200):  # the joined thread leaves /proc/self/task a moment later
            if len(os.listdir("/proc/self/task")) == 1:
                break
            time.sleep(0.01)
        pager = uswap.Pager(limit=4 * MiB, devices="zpool:64MiB", fault_mode="signal", syscall_guard=True)
        region = pager.map(16 * MiB)
        mv = memoryview(region)
        pages = len(mv) // 4096
        for i in range(pages):
            mv[i * 4096:(i + 1) * 4096] = os.urandom(4096)
        assert pager.stats()["pswpout"] > 0
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        for k in range(64):
            i = (k * 37) % (pages // 2)
            data = os.urandom(4096)
            a.send(data)
            assert b.recv_into(mv[i * 4096:(i + 1) * 4096]) == 4096
            assert bytes(mv[i * 4096:(i + 1) * 4096]) == data, i
        print("received", pager.stats()["syscall_efault"])
        """
    )
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split("\n")[:2] == ["refused", "received 0"], out.stdout + out.stderr


def test_stats_use_the_bench_counter_names_and_set_limit_applies_at_once(pager):
    st = pager.stats()
    for name in ["pgfault", "pgmajfault", "pswpin", "pswpout", "resident_pages", "limit_pages", "swpout_zero"]:
        assert isinstance(st[name], int), name
    assert st["limit_pages"] * uswap.PAGE_SIZE == pager.limit == 8 * MiB
    assert [d["name"].split("(")[0] for d in st["devices"]] == ["zpool"], st["devices"]
    region = pager.map(8 * MiB)
    a = np.frombuffer(region, dtype=np.uint32)
    a[:] = np.arange(a.size, dtype=np.uint32)  # fills the whole budget
    pager.set_limit("2MiB")
    st = pager.stats()
    assert pager.limit == 2 * MiB and st["limit_pages"] * uswap.PAGE_SIZE == 2 * MiB
    assert st["resident_pages"] * uswap.PAGE_SIZE <= 2 * MiB, "the lower limit was reached before set_limit returned"
    assert st["pswpout"] > 0
    assert np.array_equal(a, np.arange(a.size, dtype=np.uint32))


def test_auto_budget_moves_the_limit_down_to_what_is_used_and_reports_stalls():
    p = uswap.Pager("64MiB", "zpool", auto=0.01)
    region = p.map(32 * MiB)
    a = np.frombuffer(region, dtype=np.uint64)
    a[:] = np.arange(a.size, dtype=np.uint64)  # 32 MiB resident, then only 4 MiB used
    hot = a[: (4 * MiB) // 8]
    deadline = time.monotonic() + 30
    while p.limit > 24 * MiB:
        assert time.monotonic() < deadline, f"the limit stayed at {p.limit} with 4 MiB in use: {p.stats()['stall']}"
        hot += 1
        time.sleep(0.05)
    st = p.stats()
    assert set(st["stall"]) == {"seconds_total", "avg10", "avg60", "avg300"}, st["stall"]
    assert st["limit_pages"] * uswap.PAGE_SIZE == p.limit
    assert np.array_equal(a[hot.size :], np.arange(hot.size, a.size, dtype=np.uint64)), "the cold part read back"
    with pytest.raises(uswap.InvalidArgumentError, match="share of wall time"):
        uswap.Pager("64MiB", "zpool", auto=2.0)
    # As `uswap run --auto=` takes it; a bool or a word is refused, not taken for a number.
    assert uswap.Pager("64MiB", "zpool", auto="2%").limit == 64 * MiB
    for bad in ("60%", "often", True):
        with pytest.raises(uswap.InvalidArgumentError, match="auto"):
            uswap.Pager("64MiB", "zpool", auto=bad)


def test_idle_age_sends_untouched_memory_out_and_counts_it():
    p = uswap.Pager("256MiB", "zpool", idle_age=2)
    region = p.map(32 * MiB)
    a = np.frombuffer(region, dtype=np.uint64)
    a[:] = np.arange(a.size, dtype=np.uint64)  # 32 MiB, then nothing touched, no pressure
    deadline = time.monotonic() + 30
    while p.stats()["swpout_idle"] * uswap.PAGE_SIZE < 28 * MiB:
        assert time.monotonic() < deadline, f"idle pages stayed in: {p.stats()['idle']}"
        time.sleep(0.25)
    st = p.stats()
    assert set(st["idle"]) == {"idle_1s_bytes", "idle_10s_bytes", "idle_60s_bytes", "idle_600s_bytes"}, st["idle"]
    assert st["idle"]["idle_1s_bytes"] >= 28 * MiB, st["idle"]
    assert p.limit == 256 * MiB
    assert np.array_equal(a, np.arange(a.size, dtype=np.uint64)), "every word read back"
    with pytest.raises(uswap.InvalidArgumentError, match="idle_age"):
        uswap.Pager("64MiB", "zpool", idle_age=0.5)
    # As `uswap run --idle-age` takes it.
    for ok in ("90s", "2m", "never", "off"):
        uswap.Pager("64MiB", "zpool", idle_age=ok)
    for bad in ("0.5s", "2 days", False):
        with pytest.raises(uswap.InvalidArgumentError, match="idle_age"):
            uswap.Pager("64MiB", "zpool", idle_age=bad)


def test_tier_age_moves_pages_out_of_ram_down_to_the_zstd_pool():
    p = uswap.Pager("16MiB", "zpool:256MiB,zpool:256MiB:zstd-1", tier_age="1s")
    region = p.map(64 * MiB)
    a = np.frombuffer(region, dtype=np.uint64)
    a[:] = np.arange(a.size, dtype=np.uint64)  # 48 MiB of it goes out to the lz4 pool
    deadline = time.monotonic() + 30
    while p.stats()["writeback_idle"] * uswap.PAGE_SIZE < 32 * MiB:
        assert time.monotonic() < deadline, f"pages stayed on lz4: {p.stats()['devices']}"
        time.sleep(0.25)
    assert p.stats()["swpout_idle"] == 0, "idle aging is off"
    assert np.array_equal(a, np.arange(a.size, dtype=np.uint64)), "every word read back"
    with pytest.raises(uswap.InvalidArgumentError, match="tier"):
        uswap.Pager("64MiB", "zpool", tier_age=30)  # no tier below
    for bad in (0.5, "0.5s", "never", True):
        with pytest.raises(uswap.InvalidArgumentError, match="tier_age"):
            uswap.Pager("64MiB", "zpool,zpool:zstd-1", tier_age=bad)


@pytest.mark.parametrize("mode", ["thread", "signal"])
def test_a_region_the_program_moves_keeps_its_bytes_and_its_address_follows(mode):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mremap.restype = ctypes.c_void_p
    libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    # Not a multiple of 2 MiB: the kernel pads such anonymous mappings to align them (for
    # huge pages), and a padded one would not fit the hole the moved region leaves.
    size = 16 * MiB - 4096
    p = uswap.Pager("8MiB", "zpool", fault_mode=mode)
    moved = p.map(size)
    data = os.urandom(size)  # half of it goes out under the limit
    memoryview(moved)[:] = data
    old = moved.address
    # The destination is reserved first: MREMAP_FIXED replaces whatever is there, and an
    # address picked blindly can be the interpreter's memory or another pager's.
    dst = libc.mmap(None, size, 0, 0x22, -1, 0)  # PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS
    assert dst not in (None, 2**64 - 1), ctypes.get_errno()
    assert libc.mremap(old, size, size, 3, dst) == dst, ctypes.get_errno()  # MAYMOVE|FIXED
    # The pager's next region goes where the moved one was (this panicked, and unmapped the
    # moved region's memory, when regions were known by where they were mapped). The kernel
    # gives the highest hole that fits, the one just left unless a higher one opened
    # meanwhile: a few more regions fill those.
    fresh = [p.map(size)]
    while fresh[-1].address != old and len(fresh) < 8:
        fresh.append(p.map(size))
    assert moved.address == dst and fresh[-1].address == old, [hex(f.address) for f in fresh]
    assert bytes(memoryview(moved)) == data, "the moved region's bytes"
    for f in fresh:
        assert bytes(memoryview(f)) == bytes(size), "a new region reads zeros"
        f.release()
    moved.release()


def test_arrays_outlive_the_block_and_the_pager_object():
    pager = uswap.Pager(limit=8 * MiB, devices="zpool:128MiB")
    with pager.numpy(threshold="64KiB") as h:
        assert h.threshold == 64 << 10
        big = np.full(4 * MiB, 3, dtype=np.int64)  # 32 MiB
        small = np.ones(100)  # below the threshold: the C library's malloc
        grown = np.fromiter((i * 5 for i in range(300_000)), dtype=np.int64)  # realloc'd past the threshold
    assert pager.stats()["numpy_blocks"] == 2, "big and grown are managed, small is not"
    del pager
    gc.collect()
    big += 1  # the engine lives on for the arrays it holds
    assert (big == 4).all()
    assert small.sum() == 100
    assert np.array_equal(grown, np.arange(300_000, dtype=np.int64) * 5)
    del big, grown, small
    gc.collect()


def test_nested_and_per_thread_handlers(pager):
    other = uswap.Pager(limit=8 * MiB, devices="ram:64MiB")
    outside = handler_name()
    seen = []
    with pager.numpy():
        a = np.zeros(2 * MiB)
        with other.numpy():
            b = np.zeros(2 * MiB)
            t = threading.Thread(target=lambda: seen.append(handler_name()))
            t.start()
            t.join(timeout=30)
        c = np.zeros(2 * MiB)
    assert seen == [outside], "another thread keeps its own handler"
    assert handler_name() == outside
    assert pager.stats()["numpy_blocks"] == 2 and other.stats()["numpy_blocks"] == 1
    a[:] = 1
    b[:] = 2
    c[:] = 3
    assert a.sum() == 2 * MiB and b.sum() == 4 * MiB and c.sum() == 6 * MiB

    # One allocator entered by two threads whose blocks interleave: each exit restores its
    # own thread's handler.
    shared = pager.numpy()
    inside, done, names = threading.Event(), threading.Event(), []

    def second():
        with shared:
            names.append(handler_name())
            inside.set()
            assert done.wait(30), "the main thread did not leave its block"
        names.append(handler_name())

    t = threading.Thread(target=second)
    t.start()
    assert inside.wait(30), "the second thread did not enter"
    with shared:
        names.append(handler_name())
    names.append(handler_name())
    done.set()
    t.join(timeout=30)
    assert not t.is_alive()
    assert names == ["uswap", "uswap", outside, outside], names


def test_handlers_follow_asyncio_tasks_and_exits_must_be_in_order(pager):
    """numpy keeps its handler per context, so each asyncio task has its own; the handler an
    exit puts back is the one its own task saved. Kept per thread, two tasks popped each
    other's entries, and one went on allocating into a pager it had never entered."""
    import asyncio

    other = uswap.Pager(limit=8 * MiB, devices="ram:64MiB")
    outside = handler_name()
    x, a = pager.numpy(threshold=0), other.numpy(threshold=0)
    seen = {}

    async def first(entered, second_done):
        with x:
            with a:
                entered.set()
                await second_done.wait()
            seen["first, after a"] = handler_name()
            np.ones(1000)
        seen["first, after x"] = handler_name()

    async def second(entered, second_done):
        await entered.wait()
        with a:
            second_done.set()
            await asyncio.sleep(0.05)
        seen["second, after a"] = handler_name()
        np.ones(1000)

    async def main():
        entered, second_done = asyncio.Event(), asyncio.Event()
        await asyncio.gather(first(entered, second_done), second(entered, second_done))

    before = (pager.stats()["numpy_blocks"], other.stats()["numpy_blocks"])
    asyncio.run(main())
    assert seen == {"first, after a": "uswap", "first, after x": outside, "second, after a": outside}, seen
    # The first task's array after its inner block went to its outer allocator's pager; the
    # second task's, after its block, to numpy's own handler, not to `pager`.
    assert pager.stats()["numpy_blocks"] <= before[0] + 1
    assert handler_name() == outside

    # Exits out of order are refused, and the handler stays that of the innermost entry.
    x.__enter__()
    a.__enter__()
    with pytest.raises(RuntimeError, match="out of order"):
        x.__exit__(None, None, None)
    a.__exit__(None, None, None)
    x.__exit__(None, None, None)
    assert handler_name() == outside
    with pytest.raises(RuntimeError, match="without a matching __enter__"):
        x.__exit__(None, None, None)


def test_a_region_is_read_by_other_threads_while_it_is_released(pager):
    """`release()` lets the GIL go while it frees the region's slots; other threads see the
    region released meanwhile. It held the object's borrow across, and their `len(r)`
    raised RuntimeError('Already mutably borrowed')."""
    r = pager.map(256 * MiB)
    memoryview(r)[:: 4096] = b"\1" * (256 * MiB // 4096)
    errors, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                assert len(r) == 256 * MiB
                r.released
            except Exception as e:  # noqa: BLE001 - any error is the failure
                errors.append(repr(e))
                return

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.01)
    r.release()
    stop.set()
    t.join(timeout=30)
    assert errors == [] and r.released


README_SUBSTITUTIONS = [
    ('limit="2GiB"', 'limit="8MiB"'),
    ('devices="zpool,file:/var/tmp"', 'devices="zpool:64MiB,file:/var/tmp:64MiB"'),
    ("pager.map(8 << 30)", "pager.map(32 << 20)"),
    ("np.zeros((50_000, 20_000))", "np.zeros((500, 20_000))"),
    ('pager.set_limit("1GiB")', 'pager.set_limit("4MiB")'),
]


def test_the_readme_example_runs_as_written_at_a_smaller_size():
    readme = (REPO / "README.md").read_text()
    m = re.search(r"<!-- python-example -->\n```python\n(.*?)```", readme, re.S)
    assert m, "README.md has no Python example after <!-- python-example -->"
    code = m.group(1)
    for old, new in README_SUBSTITUTIONS:
        assert old in code, f"the README example changed: {old!r} not found"
        code = code.replace(old, new)
    code += textwrap.dedent(
        """
        assert c.shape == (500,) and not c.any()
        assert a.size == (32 << 20) // 8 and not a.any()
        st = pager.stats()
        assert st["limit_pages"] * uswap.PAGE_SIZE == 4 << 20 and st["numpy_blocks"] == 1
        print("example ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith("example ok"), out.stdout
    assert "'pswpout'" in out.stdout, "the example prints the counters"


def test_signal_mode_serves_numpy_in_several_threads():
    """Signal mode: the faulting thread serves its fault (pytest's faulthandler installed its
    SIGBUS handler first; uswap passes it what is not a managed page)."""
    pager = uswap.Pager(limit=4 * MiB, devices="zpool:64MiB", fault_mode="signal")
    assert pager.fault_mode == "signal"
    region = pager.map(16 * MiB)
    a = np.frombuffer(region, dtype=np.uint32)
    a[:] = np.arange(a.size, dtype=np.uint32)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(np.array_equal(a, np.arange(a.size, dtype=np.uint32))))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a thread is stuck on a signal-mode fault"
    assert results == [True, True, True]
    assert pager.stats()["pswpout"] > 0 and pager.stats()["pswpin"] > 0


def test_set_limit_releases_the_gil_while_it_reclaims():
    """With a 10 s switch interval the interpreter never takes the GIL from a thread that
    holds it; another thread can run during set_limit only if set_limit lets go of it."""
    pager = uswap.Pager(limit=64 * MiB, devices="ram:128MiB")
    region = pager.map(48 * MiB)
    a = np.frombuffer(region, dtype=np.uint64)
    a[:] = np.arange(a.size, dtype=np.uint64)
    samples, stop, started = [], threading.Event(), threading.Event()

    def ticker():
        started.set()
        while not stop.is_set():
            samples.append(time.monotonic())
            time.sleep(0.0002)

    old = sys.getswitchinterval()
    sys.setswitchinterval(10)
    try:
        t = threading.Thread(target=ticker)
        t.start()
        assert started.wait(30)
        t0 = time.monotonic()
        pager.set_limit("2MiB")
        t1 = time.monotonic()
        stop.set()
    finally:
        sys.setswitchinterval(old)
    t.join(timeout=30)
    assert not t.is_alive()
    during = [s for s in samples if t0 < s < t1]
    assert pager.stats()["resident_pages"] * uswap.PAGE_SIZE <= 2 * MiB
    assert len(during) >= 3, f"the other thread ran {len(during)} times in {1e3 * (t1 - t0):.1f} ms of set_limit"
    assert np.array_equal(a, np.arange(a.size, dtype=np.uint64))


def test_blocks_the_engine_refuses_fall_back_to_malloc_and_are_counted(pager):
    """A process has 65,536 region slots; numpy blocks past them go to malloc, still correct."""
    arrays = []
    with pager.numpy(threshold=uswap.PAGE_SIZE):
        # Bounded: the slots run out before 70,000 blocks (the kernel merges the blocks'
        # neighbouring mappings, so its map count does not end it first).
        while len(arrays) < 70_000:
            arrays.append(np.full(1024, len(arrays), dtype=np.int64))  # 8 KiB each
            if len(arrays) % 4096 == 0 and pager.stats()["numpy_fallbacks"] > 0:
                break
    st = pager.stats()
    assert st["numpy_fallbacks"] > 0, st
    assert st["numpy_blocks"] + st["numpy_fallbacks"] == len(arrays)
    assert all(int(a[0]) == i and int(a[-1]) == i for i, a in enumerate(arrays))
    del arrays
    gc.collect()
    st = pager.stats()
    assert st["numpy_blocks"] == 0 and st["resident_pages"] == 0, st


def test_python_m_uswap_run_pages_a_program_with_the_packaged_command(tmp_path):
    """`python -m uswap run` works from the installed package alone: the command and its
    preload library came with it (no Rust checkout, no USWAP_PRELOAD_LIB)."""
    program = textwrap.dedent(
        """
        import hashlib, os, random
        rng = random.Random(7)
        words = [bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz ") for _ in range(8)) for _ in range(512)]
        chunks = []
        for i in range(96):  # 96 MiB, each MiB half random bytes and half text
            text = b"".join(rng.choice(words) for _ in range(65536))[: 1 << 19]
            chunks.append(bytearray(os.urandom(1 << 19) + text))
        before = [hashlib.sha256(c).hexdigest() for c in chunks]
        after = [hashlib.sha256(bytes(c)).hexdigest() for c in chunks]
        print("same" if before == after else "DIFFERENT", len(chunks))
        """
    )
    stats = tmp_path / "stats.json"
    env = {k: v for k, v in os.environ.items() if k != "USWAP_PRELOAD_LIB"}
    r = subprocess.run(
        [sys.executable, "-m", "uswap", "run", "--limit", "32MiB", "--stats-json", str(stats), "--",
         sys.executable, "-c", program],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "same 96", (r.stdout, r.stderr)
    counters = __import__("json").loads(stats.read_text())
    assert counters["pswpout"] > 0, counters



def test_a_pager_under_uswap_run_is_refused_saying_why():
    """Under `uswap run` its library pages the program's memory and takes its mmap, ioctl and
    signal handlers: a pager of the package beside it crashed on the first page it moved out."""
    program = "import uswap\ntry:\n    uswap.Pager('16MiB')\nexcept uswap.InvalidArgumentError as e:\n    print('refused:', e)\n"
    env = {k: v for k, v in os.environ.items() if k != "USWAP_PRELOAD_LIB"}
    r = subprocess.run(
        [sys.executable, "-m", "uswap", "run", "--limit", "64MiB", "--", sys.executable, "-c", program],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("refused:") and "uswap run" in r.stdout, (r.stdout, r.stderr)


FORK_SCRIPT = r'''
import hashlib, os, sys, time
import multiprocessing as mp
import numpy as np
import uswap

MiB = 1 << 20
mode = sys.argv[1]
pager = uswap.Pager(limit=8 * MiB, devices="zpool:256MiB", fault_mode=mode)
other = uswap.Pager(limit=8 * MiB, devices="zpool:64MiB", fault_mode=mode)
assert pager.regions_survive_fork and not other.regions_survive_fork
other_region = other.map(MiB)
memoryview(other_region)[:5] = b"hello"
region = pager.map(32 * MiB)
view = memoryview(region)
data = os.urandom(len(view))
view[:] = data
with pager.numpy():
    arr = np.frombuffer(os.urandom(16 * MiB), dtype=np.uint64).copy()
digest = hashlib.sha256(arr.tobytes()).digest()
assert pager.stats()["pswpout"] > 0, "the data is 6x the limit: most of it is out at the fork"
pager.set_limit(12 * MiB)  # a child's pager starts from the limit at the fork


def wait(pid, what, bound_s=60):
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(f"{what}: the child did not end within {bound_s} s")


def child_checks(depth):
    """In a fork child: every byte as at the fork, its writes its own, a pager of its own."""
    checks = [bytes(view) == data, hashlib.sha256(arr.tobytes()).digest() == digest]
    view[: 4 * MiB] = b"\xa5" * (4 * MiB)
    arr[:1024] = depth
    fresh = pager.map(24 * MiB)
    fresh_view = memoryview(fresh)
    fresh_data = os.urandom(len(fresh_view))
    fresh_view[:] = fresh_data
    checks += [bytes(fresh_view) == fresh_data, pager.stats()["pswpout"] > 0]
    checks += [bytes(view[: 4 * MiB]) == b"\xa5" * (4 * MiB), bytes(view[4 * MiB :]) == data[4 * MiB :]]
    checks += [pager.limit == 12 * MiB, pager.regions_survive_fork, not other.regions_survive_fork]
    for call in (lambda: other.map(MiB), other.stats, lambda: other.set_limit(16 * MiB)):
        try:
            call()
            checks.append(False)
        except uswap.InvalidArgumentError:
            checks.append(True)  # not re-armed: its engine is the parent's
    # Nor its regions: a view of one read pages that are not here (the child died of SIGSEGV).
    for call, error in ((lambda: memoryview(other_region), BufferError), (other_region.mapped_pages, uswap.InvalidArgumentError)):
        try:
            call()
            checks.append(False)
        except error:
            checks.append(True)
    if depth == 1:
        # A fork of the child: the grandchild reads the child's bytes.
        pid = os.fork()
        if pid == 0:
            ok = bytes(view[: 4 * MiB]) == b"\xa5" * (4 * MiB) and bytes(fresh_view) == fresh_data
            os._exit(0 if ok else 1)
        checks.append(wait(pid, "grandchild") == 0)
    return checks


pid = os.fork()
if pid == 0:
    code = 2
    try:
        checks = child_checks(1)
        code = 0 if all(checks) else 10 + checks.index(False)
    finally:
        os._exit(code)
assert wait(pid, "os.fork") == 0, "the child's checks failed"
assert bytes(view) == data and hashlib.sha256(arr.tobytes()).digest() == digest, "the parent's bytes changed"


def part_sum(k):
    return int(arr[k * 2 * MiB // 8 : (k + 1) * 2 * MiB // 8].sum(dtype=np.uint64))


with mp.get_context("fork").Pool(2) as pool:
    parts = pool.map_async(part_sum, range(8)).get(timeout=60)
assert sum(parts) % (1 << 64) == int(arr.sum(dtype=np.uint64)), "the workers read other bytes"
# A preexec_fn makes subprocess fork: the child re-arms a pager, then closes every
# descriptor above 2 (close_fds) and execs. Its pager's threads find their descriptors
# closed; nothing needs them before the exec, so the child is not ended.
import subprocess
for _ in range(20):
    subprocess.run(["true"], preexec_fn=lambda: None, check=True, timeout=30)
print("fork ok", pager.stats()["pswpout"])
'''


@pytest.mark.parametrize("mode", ["thread", "signal"])
def test_fork_children_read_every_byte_and_page_under_their_own_pager(mode, tmp_path):
    # In a process of its own: a fork of the test runner would run its teardown twice.
    script = tmp_path / "fork_children.py"
    script.write_text(FORK_SCRIPT)
    r = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "fork ok" in r.stdout, f"status {r.returncode}\n{r.stdout}\n{r.stderr}"
