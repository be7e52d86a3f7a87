//! Fault delivery: how a fault on a managed page reaches the engine, and what is done when
//! its service fails. The service itself (what a page's state calls for) is
//! `crate::fault_service`'s; both modes go through the one retry loop of [`retry`].
//!
//! * Thread mode ([`thread`]): handler threads read the userfaultfd; [`handler_pool`]
//!   decides which of them wait on it. Faults raised inside system calls arrive too.
//! * Signal mode ([`signal`]): the faulting thread serves its own fault in its SIGBUS
//!   handler, allocating nothing and taking no lock it could hold.
//!
//! Locking: none of its own; ownership of a page is its busy bit (see `crate::page_table`).

pub(crate) mod handler_pool;
mod retry;
mod signal;
mod thread;

pub(crate) use retry::serve_with_retries;
pub(crate) use signal::sigbus_fault;
pub(crate) use thread::handler_thread;
