//! Guest sleeps the EP can interrupt: the EP's own WASI preview 1 `poll_oneoff`.
//!
//! Why: wasmtime-wasi 48 serves a `poll_oneoff` on exactly one *relative* clock (what a Rust,
//! C or Go guest's `sleep` becomes) with `std::thread::sleep` whenever the context allows
//! blocking the current thread (`p1.rs`, `WasiP1Ctx::poll_oneoff`: "special case … just
//! sleeping on a single relative timer event"). The EP allows it, because file I/O done on the
//! run's own thread is about twice as fast as through tokio's blocking pool (see
//! `runtime::build_wasi`). A thread sleep is beyond the epoch (the guest is in the host, not in
//! wasm) and beyond the host timer's `select!` (the future never yields), so a guest asking for
//! a sleep of years held its run's thread, and its pooling slot, until the sleep ended: past
//! `cpus + 16` such guests every instantiation on the EP failed.
//!
//! The choice: shadow the one import, `wasi_snapshot_preview1::poll_oneoff`, in the EP's
//! linker. A call that would take wasmtime-wasi's thread-sleep path is served here by a tokio
//! timer awaited inside the guest's fiber; every other call goes on to wasmtime-wasi's own
//! implementation (its generated host function, as its linker would call it), which already
//! waits on tokio timers and streams. The guest's run is then parked in an async host call
//! like any other, and the run's `select!` (see `runtime`) drops it at the job's deadline or on
//! its cancel: the timer is dropped with it, the store and its pooling slot are freed, the
//! thread returns. Alternatives weighed: turning blocking off (the sleep path is gone, but all
//! file I/O goes through `spawn_blocking`, measured 1.8× slower on a 256 MiB input); running a
//! watchdog that signals the sleeping thread (`pthread_kill` does not end `nanosleep` early in
//! Rust's std, which loops on `EINTR`); converting the sleep into a multi-subscription call
//! (it would write into guest memory). Preview 2 components need nothing: their
//! `monotonic-clock.subscribe-duration` is a tokio timer already, awaited through the async
//! bindings the EP links.
//!
//! What the guest sees is unchanged: the same event (its `userdata`, `clock`, success) after
//! the same relative timeout, whatever the clock id (as wasmtime-wasi's fast path does), the
//! same traps for bad pointers (the subscription is read with wiggle's checks, and a call whose
//! subscription does not read goes to wasmtime-wasi, which fails it the same way).
//!
//! Knows nothing of jobs, deadlines or cancels: bounding the wait is the run's business.

use wasmtime::{AsContextMut as _, Caller, Extern, Linker};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p1::types::{
    Errno, Event, EventFdReadwrite, Eventrwflags, Eventtype, Subclockflags, Subscription, SubscriptionU,
};
use wasmtime_wasi::p1::wasi_snapshot_preview1::{self as generated, WasiSnapshotPreview1 as _};
use wiggle::{GuestMemory, GuestPtr};

/// The WASI preview 1 module name.
const MODULE: &str = "wasi_snapshot_preview1";

/// Replaces `poll_oneoff` in `linker` (which must already hold wasmtime-wasi's preview 1 host,
/// added with `add_to_linker_async`) by [`poll_oneoff`]. `wasi` projects the store's state to
/// its WASI context, as for `add_to_linker_async`.
pub(crate) fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    wasi: fn(&mut T) -> &mut WasiP1Ctx,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let defined = linker
        .func_wrap_async(
            MODULE,
            "poll_oneoff",
            move |caller: Caller<'_, T>, (subs, events, n, nevents): (i32, i32, i32, i32)| {
                Box::new(poll_oneoff(caller, wasi, [subs, events, n, nevents]))
            },
        )
        .map(|_| ());
    linker.allow_shadowing(false);
    defined
}

/// `poll_oneoff(in, out, nsubscriptions, nevents_ptr) -> errno`: a single relative clock is
/// slept on a tokio timer here; anything else is wasmtime-wasi's.
async fn poll_oneoff<T>(
    mut caller: Caller<'_, T>,
    wasi: fn(&mut T) -> &mut WasiP1Ctx,
    [subs, events, n, nevents]: [i32; 4],
) -> wasmtime::Result<i32> {
    // wasmtime-wasi's own wrapper does exactly this to find the memory and the fuel.
    let fuel = caller.as_context_mut().hostcall_fuel();
    let export = caller.get_export("memory");
    let (mut memory, ctx) = match &export {
        Some(Extern::Memory(m)) => {
            let (bytes, state) = m.data_and_store_mut(&mut caller);
            (GuestMemory::Unshared(bytes), wasi(state))
        }
        Some(Extern::SharedMemory(m)) => (GuestMemory::Shared(m.data()), wasi(caller.data_mut())),
        _ => return Err(wasmtime::Error::msg("missing required memory export")),
    };
    ctx.set_hostcall_fuel(fuel);
    let Some((userdata, timeout)) = single_relative_clock(&memory, subs, n) else {
        return generated::poll_oneoff(ctx, &mut memory, subs, events, n, nevents).await;
    };
    // `memory` borrows the store and is not used past here, so the store is free while the
    // guest is parked; the memory is borrowed again after. tokio clamps a deadline it cannot
    // represent to about 30 years: a sleep "forever" is one.
    tokio::time::sleep(std::time::Duration::from_nanos(timeout)).await;
    let export = caller.get_export("memory");
    match &export {
        Some(Extern::Memory(m)) => {
            write_wakeup(&mut GuestMemory::Unshared(m.data_mut(&mut caller)), userdata, events, nevents)
        }
        Some(Extern::SharedMemory(m)) => write_wakeup(&mut GuestMemory::Shared(m.data()), userdata, events, nevents),
        _ => Err(wasmtime::Error::msg("missing required memory export")),
    }
}

/// The subscription's `userdata` and timeout, when the call is what wasmtime-wasi would serve
/// with a thread sleep: one subscription, a clock, relative. `None` for anything else,
/// including a subscription that cannot be read (wasmtime-wasi then fails the call its way).
fn single_relative_clock(memory: &GuestMemory<'_>, subs: i32, n: i32) -> Option<(u64, u64)> {
    if n != 1 {
        return None;
    }
    let sub = memory.read(GuestPtr::<Subscription>::new(subs.cast_unsigned())).ok()?;
    match sub.u {
        SubscriptionU::Clock(clock) if !clock.flags.contains(Subclockflags::SUBSCRIPTION_CLOCK_ABSTIME) => {
            Some((sub.userdata, clock.timeout))
        }
        _ => None,
    }
}

/// Writes the one clock event and `nevents = 1`, as wasmtime-wasi's fast path does; a pointer
/// out of bounds or misaligned traps, as there.
fn write_wakeup(memory: &mut GuestMemory<'_>, userdata: u64, events: i32, nevents: i32) -> wasmtime::Result<i32> {
    let event = Event {
        userdata,
        error: Errno::Success,
        type_: Eventtype::Clock,
        fd_readwrite: EventFdReadwrite { flags: Eventrwflags::empty(), nbytes: 1 },
    };
    memory.write(GuestPtr::<Event>::new(events.cast_unsigned()), event).map_err(wasmtime::Error::new)?;
    memory.write(GuestPtr::<u32>::new(nevents.cast_unsigned()), 1).map_err(wasmtime::Error::new)?;
    Ok(Errno::Success as i32)
}
