//! Engine threads: fault handlers, the reclaimer, the event reader. They start with every
//! asynchronous signal blocked, their stacks count as the engine's memory, and a panic on
//! one aborts the process with its message (the engine cannot go on without it).
//!
//! Locking: none; the per-thread flag is a const-initialised thread-local.

use std::io;

use super::engine_ranges::{forget_engine_range, note_engine_range};

/// Signals an engine thread keeps unblocked: SIGBUS, which the kernel raises for a
/// userfaultfd fault that uswap's handler serves, and SIGTRAP, a debugger's breakpoint. The
/// other synchronous ones (SIGSEGV, SIGILL, SIGFPE) are blocked too: raised by an engine
/// thread's own fault they still kill the process (the kernel forces them), which is what
/// a bug in the engine should do; unblocked, a SIGSEGV sent to the process (`kill`) ran the
/// program's handler on an engine thread (most of 300 did, where the program's threads
/// blocked it), and one that read managed memory there waited in thread mode for the fault
/// its own thread was to serve: the program hung.
const SYNCHRONOUS_SIGNALS: [libc::c_int; 2] = [libc::SIGBUS, libc::SIGTRAP];

/// Engine threads alive now: counted from the first instruction of their closure to its
/// end, so that the count is never above the threads the kernel counts (what
/// [`live_engine_threads`]'s caller compares it with).
static LIVE_ENGINE_THREADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many of the process's threads are uswap's engine threads now.
pub fn live_engine_threads() -> usize {
    LIVE_ENGINE_THREADS.load(std::sync::atomic::Ordering::Acquire)
}

/// In a fork child, before it starts threads of its own: the parent's engine threads are
/// not in it (the one thread a fork copies is the program's).
pub fn forget_engine_threads_in_fork_child() {
    LIVE_ENGINE_THREADS.store(0, std::sync::atomic::Ordering::Release);
}

/// The calling engine thread runs the program's code from now on, until it ends (it calls
/// `exit` for a program whose threads all left): its calls and allocations are the
/// program's, as if it were one of its threads.
pub fn become_program_thread() {
    if ENGINE_THREAD.with(|t| t.replace(false)) {
        LIVE_ENGINE_THREADS.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

thread_local! {
    /// Set for the life of every thread [`spawn_engine_thread`] starts (no destructor, no
    /// allocation: reading it is safe anywhere, an interposed `malloc` included).
    static ENGINE_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is one of uswap's engine threads (fault handlers, reclaimer,
/// event reader). An allocator that serves the application from managed memory must serve
/// these threads from ordinary memory: an engine thread that touched a swapped-out page
/// would wait for itself.
pub fn is_engine_thread() -> bool {
    ENGINE_THREAD.with(|t| t.get())
}

/// Starts an engine thread (fault handler, reclaimer) with every asynchronous signal blocked
/// for its whole life. A process-directed signal (`kill(getpid())`, `setitimer`, a terminal's
/// SIGINT) then goes to an application thread: an application handler that touches managed
/// memory on an engine thread would wait for the engine itself (thread mode: the handler
/// threads sleep in the fault they are meant to serve), and one that runs on top of engine
/// code would see the engine's state half-changed. The mask is set in the spawning thread
/// around the `clone`, so the new thread has it from its first instruction.
pub fn spawn_engine_thread<F>(name: String, f: F) -> io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    // SAFETY: sigset_t is plain data; sigfillset/sigdelset/pthread_sigmask only read and
    // write the two sets we own and the calling thread's mask, which is restored below.
    let old = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for s in SYNCHRONOUS_SIGNALS {
            libc::sigdelset(&mut set, s);
        }
        let r = libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        old
    };
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        ENGINE_THREAD.with(|t| t.set(true));
        LIVE_ENGINE_THREADS.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        // The thread's stack is the engine's memory, not the program's (see
        // `is_engine_memory`).
        let stack = current_thread_stack();
        if let Some((addr, len)) = stack {
            note_engine_range(addr, len);
        }
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
            die_of_engine_panic();
        }
        if let Some((addr, _)) = stack {
            forget_engine_range(addr);
        }
        become_program_thread();
    });
    // SAFETY: restores the caller's own mask, saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    spawned
}

/// Ends the process after a panic on an engine thread (the panic hook has printed its
/// message). The engine cannot go on without one of its threads: faults nobody serves, a
/// limit nobody keeps, events nobody applies. Each of those is a hang later, far from the
/// cause; aborting now keeps the cause in view (and in a core dump).
fn die_of_engine_panic() -> ! {
    let name = std::thread::current().name().unwrap_or("unnamed").to_string();
    eprintln!(
        "uswap: engine thread {name} panicked (its message is above); the engine cannot go on without it, so the \
         process aborts. Please report it with that message."
    );
    std::process::abort()
}

/// The calling thread's stack, `(lowest address, length)`, as the C library placed it.
fn current_thread_stack() -> Option<(usize, usize)> {
    // SAFETY: pthread_attr_t is plain data that pthread_getattr_np initialises; the
    // attribute object is destroyed after its stack is read.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let (mut addr, mut len) = (std::ptr::null_mut(), 0usize);
        let r = libc::pthread_attr_getstack(&attr, &mut addr, &mut len);
        libc::pthread_attr_destroy(&mut attr);
        (r == 0).then_some((addr as usize, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child this test starts: the child panics on an engine thread.
    const PANIC_CHILD: &str = "USWAP_TEST_ENGINE_PANIC_CHILD";

    /// A panic on an engine thread ends the process (SIGABRT) with the panic's message and
    /// uswap's, instead of leaving an engine without the thread (a hang later). Run in a
    /// child: this test binary again, on this test alone.
    #[test]
    fn a_panic_on_an_engine_thread_aborts_the_process_with_its_message() {
        if std::env::var_os(PANIC_CHILD).is_some() {
            let t = spawn_engine_thread("uswap-test-panics".into(), || panic!("the test's panic")).unwrap();
            let _ = t.join();
            std::thread::sleep(std::time::Duration::from_secs(5));
            eprintln!("still alive after the engine thread's panic");
            std::process::exit(0);
        }
        let exe = std::env::current_exe().unwrap();
        let mut child = std::process::Command::new(exe)
            .args([
                "--exact",
                "mapping::engine_thread::tests::a_panic_on_an_engine_thread_aborts_the_process_with_its_message",
            ])
            .args(["--nocapture", "--test-threads=1"])
            .env(PANIC_CHILD, "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("the child neither aborted nor exited in 30 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGABRT), "{status}: {err}");
        assert!(err.contains("the test's panic"), "{err}");
        assert!(err.contains("uswap: engine thread uswap-test-panics panicked"), "{err}");
    }
}
