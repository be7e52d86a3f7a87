//! Status codes, the per-thread error message, and the guard every exported function runs in.
//!
//! Every exported function that can fail returns a `uswap_status` as a C `int`: 0 or a
//! negative code. On failure it stores a message in this thread's last-error slot first, so
//! `uswap_last_error()` after a failing call always describes that call. The message is the
//! engine's `Display` text where the engine refused, which already says what to do.
//!
//! Invariants: no panic leaves [`guard`] (it is caught and becomes `USWAP_EPANIC`), and the
//! last-error slot only ever holds a valid NUL-terminated string, replaced (never mutated in
//! place) by a failing call on the same thread, so a pointer `uswap_last_error()` returned
//! stays valid until the next failing call on that thread. No locks here: the slot is
//! thread-local.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Status codes: what every fallible uswap function returns, as an `int`. 0 is success; every
/// failure is negative, and `uswap_last_error()` then tells what went wrong and what to do.
/// New codes may be added (with new negative values); treat an unknown negative value as a
/// failure and show `uswap_last_error()`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum uswap_status {
    /// Success.
    USWAP_OK = 0,
    /// A bad argument: a null pointer, a handle that is unknown or already freed, a value out
    /// of range, a device list that does not parse, a configuration the engine refuses.
    USWAP_EINVAL = -1,
    /// Not permitted to open a userfaultfd (see the message for the ways to grant it).
    USWAP_EPERM = -2,
    /// The kernel lacks userfaultfd or `UFFDIO_MOVE`: uswap needs Linux >= 6.8.
    USWAP_ENOTSUP = -3,
    /// Out of address space, or every region slot of the process is in use.
    USWAP_ENOMEM = -4,
    /// A swap device could not be opened, or failed.
    USWAP_EDEVICE = -5,
    /// The swap devices are full: a lower resident limit could not be reached. The new limit
    /// is in place all the same.
    USWAP_ENOSPC = -6,
    /// Busy: the pager still has regions mapped (`uswap_pager_destroy`), or reclaim found
    /// every page busy in other threads (`uswap_set_resident_limit`; the limit is in place).
    USWAP_EBUSY = -7,
    /// Signal mode cannot serve faults in this process or thread: SIGBUS is blocked, or its
    /// handler was replaced after the first signal-mode pager was created, or the system-call
    /// guard was asked for in a process with more than one thread.
    USWAP_ESIGNAL = -8,
    /// A system call failed (the message names it and the reason).
    USWAP_EIO = -9,
    /// A bug in uswap: it panicked inside the call. The panic was stopped at the boundary;
    /// the object the call was given may be in an unknown state. Please report the message.
    USWAP_EPANIC = -10,
}

/// A failed call: its status and the message `uswap_last_error()` will return.
#[derive(Debug)]
pub(crate) struct Failure {
    pub status: uswap_status,
    pub message: String,
}

impl Failure {
    pub fn new(status: uswap_status, message: impl Into<String>) -> Failure {
        Failure { status, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(uswap_status::USWAP_EINVAL, message)
    }

    /// A null pointer given as argument `what` of `function`.
    pub fn null(function: &str, what: &str) -> Failure {
        Failure::invalid(format!("{function}: {what} is NULL; pass a valid pointer"))
    }
}

impl From<engine::Error> for Failure {
    fn from(e: engine::Error) -> Failure {
        use engine::ErrorKind::*;
        use uswap_status::*;
        let status = match e.kind() {
            Permission => USWAP_EPERM,
            Unsupported => USWAP_ENOTSUP,
            InvalidArgument => USWAP_EINVAL,
            OutOfMemory => USWAP_ENOMEM,
            Device => USWAP_EDEVICE,
            LimitNotReached => USWAP_ENOSPC,
            LimitBusy => USWAP_EBUSY,
            Signal => USWAP_ESIGNAL,
            Io => USWAP_EIO,
        };
        Failure::new(status, e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // A NUL inside the message would cut it short in C; none of ours has one, but an OS error
    // string is not ours.
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // Fails only while this thread's locals are being destroyed; there is no one to tell then.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = text);
}

/// This thread's last error message, for `uswap_last_error`.
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.try_with(|slot| slot.borrow().as_ptr()).unwrap_or(c"".as_ptr())
}

/// Runs the body of an exported function: `Ok` becomes `USWAP_OK`, a failure stores its
/// message and returns its code, a panic stores a message and returns `USWAP_EPANIC`.
pub(crate) fn guard(body: impl FnOnce() -> Result<(), Failure>) -> c_int {
    // AssertUnwindSafe: after a panic the caller gets USWAP_EPANIC and the message says the
    // object's state is unknown. The handle tables ignore lock poisoning and every entry is
    // replaced whole, so they stay consistent; the engine's own state is the engine's.
    let failure = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return uswap_status::USWAP_OK as c_int,
        Ok(Err(failure)) => failure,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            // The payload's own drop could panic in theory; leak it instead of risking that.
            std::mem::forget(payload);
            Failure::new(
                uswap_status::USWAP_EPANIC,
                format!(
                    "internal error in uswap (panic: {what}); the call was stopped and the object it was given \
                     may be in an unknown state. This is a bug: please report this message"
                ),
            )
        }
    };
    set_last_error(&failure.message);
    failure.status as c_int
}

/// The fixed description of a status code, for `uswap_strerror`.
pub(crate) fn describe(code: c_int) -> &'static CStr {
    use uswap_status::*;
    const CODES: [uswap_status; 11] = [
        USWAP_OK,
        USWAP_EINVAL,
        USWAP_EPERM,
        USWAP_ENOTSUP,
        USWAP_ENOMEM,
        USWAP_EDEVICE,
        USWAP_ENOSPC,
        USWAP_EBUSY,
        USWAP_ESIGNAL,
        USWAP_EIO,
        USWAP_EPANIC,
    ];
    let Some(status) = CODES.into_iter().find(|s| *s as c_int == code) else {
        return c"unknown uswap status code";
    };
    match status {
        USWAP_OK => c"success",
        USWAP_EINVAL => c"invalid argument",
        USWAP_EPERM => c"not permitted to open a userfaultfd",
        USWAP_ENOTSUP => c"the kernel lacks userfaultfd or UFFDIO_MOVE (Linux >= 6.8 needed)",
        USWAP_ENOMEM => c"out of address space or region slots",
        USWAP_EDEVICE => c"a swap device could not be opened or failed",
        USWAP_ENOSPC => c"the swap devices are full (the new limit is in place)",
        USWAP_EBUSY => c"busy",
        USWAP_ESIGNAL => c"signal mode cannot serve faults: SIGBUS blocked or its handler replaced",
        USWAP_EIO => c"a system call failed",
        USWAP_EPANIC => c"internal error in uswap (a bug; please report uswap_last_error())",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        // SAFETY: last_error_ptr returns a NUL-terminated string that lives until the next
        // failing call on this thread, and none happens while it is read.
        unsafe { CStr::from_ptr(last_error_ptr()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn a_panic_becomes_epanic_with_its_message() {
        let code = guard(|| panic!("the engine fell over"));
        assert_eq!(code, uswap_status::USWAP_EPANIC as c_int);
        let msg = last_error();
        assert!(msg.contains("the engine fell over") && msg.contains("bug"), "{msg}");
        let code = guard(|| std::panic::panic_any(17u32));
        assert_eq!(code, uswap_status::USWAP_EPANIC as c_int);
        assert!(last_error().contains("a panic without a message"));
    }

    #[test]
    fn engine_errors_become_the_status_of_their_kind() {
        let cases = [
            (engine::Error::NoDevice, uswap_status::USWAP_EINVAL),
            (engine::Error::UnderUswapRun, uswap_status::USWAP_EINVAL),
            (engine::Error::TooManyRegions { max: 4096 }, uswap_status::USWAP_ENOMEM),
            (engine::Error::LimitNotReached { resident_bytes: 2, limit_bytes: 1 }, uswap_status::USWAP_ENOSPC),
            (engine::Error::LimitBusy { resident_bytes: 2, limit_bytes: 1, waited_ms: 5 }, uswap_status::USWAP_EBUSY),
            (engine::Error::SigbusHandlerReplaced, uswap_status::USWAP_ESIGNAL),
        ];
        for (e, status) in cases {
            let msg = e.to_string();
            assert_eq!(guard(|| Err(Failure::from(e))), status as c_int, "{msg}");
            assert_eq!(last_error(), msg);
        }
    }

    #[test]
    fn a_failure_stores_its_message_and_success_leaves_it() {
        assert_eq!(guard(|| Err(Failure::invalid("no such thing"))), uswap_status::USWAP_EINVAL as c_int);
        assert_eq!(last_error(), "no such thing");
        assert_eq!(guard(|| Ok(())), 0);
        assert_eq!(last_error(), "no such thing");
        assert_eq!(guard(|| Err(Failure::invalid("with a \0 inside"))), -1);
        assert_eq!(last_error(), "with a \\0 inside");
    }

    #[test]
    fn engine_errors_keep_their_text_and_get_their_code() {
        let f = Failure::from(engine::Error::LimitTooSmall { limit_bytes: 1, min_bytes: 2 });
        assert_eq!(f.status, uswap_status::USWAP_EINVAL);
        assert!(f.message.contains("give the pager at least 2 bytes"), "{}", f.message);
        let f = Failure::from(engine::Error::SigbusBlocked);
        assert_eq!(f.status, uswap_status::USWAP_ESIGNAL);
    }

    #[test]
    fn every_code_has_its_own_description() {
        let texts: Vec<&CStr> = (-10..=0).map(describe).collect();
        for (i, t) in texts.iter().enumerate() {
            assert_ne!(*t, c"unknown uswap status code", "code {}", i as i32 - 10);
            assert!(!texts[..i].contains(t), "code {} repeats a description", i as i32 - 10);
        }
        assert_eq!(describe(-11), c"unknown uswap status code");
        assert_eq!(describe(1), c"unknown uswap status code");
    }
}
