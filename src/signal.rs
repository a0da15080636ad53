//! Stop signals: SIGINT (Ctrl-C) and SIGTERM (systemd, Kubernetes, `kill`). `tidemark run` and
//! `job run` stop their work on either, clean up (spill files, the job's lease, a ledger row with
//! status `cancelled`) and exit 130 / 143, as a shell reports a process ended by that signal.

use tracing::{info, warn};

use crate::error::ErrorClass;

/// Completes when SIGINT or SIGTERM arrives, with the class it stands for
/// ([`ErrorClass::Interrupted`] = 130, [`ErrorClass::Terminated`] = 143). Once called, the
/// signals no longer kill the process: the caller decides what to stop.
pub async fn stop_signal() -> ErrorClass {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                return tokio::select! {
                    _ = term.recv() => {
                        info!("SIGTERM received");
                        ErrorClass::Terminated
                    }
                    _ = int.recv() => {
                        info!("SIGINT received");
                        ErrorClass::Interrupted
                    }
                };
            }
            _ => warn!("cannot listen for SIGTERM; stopping on Ctrl-C only"),
        }
    }
    match tokio::signal::ctrl_c().await {
        Ok(()) => ErrorClass::Interrupted,
        // No signal handling at all: never complete, the default disposition applies.
        Err(_) => std::future::pending().await,
    }
}

/// Every SIGINT and SIGTERM from now on, in order, with the class each stands for: for a
/// command that reacts to the first signal differently from the second (`--every`: the first
/// finishes the current run, the second stops it). Once called, the signals no longer kill the
/// process.
pub fn stop_signals() -> tokio::sync::mpsc::UnboundedReceiver<ErrorClass> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            if let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) {
                loop {
                    let class = tokio::select! {
                        _ = term.recv() => ErrorClass::Terminated,
                        _ = int.recv() => ErrorClass::Interrupted,
                    };
                    info!("{} received", name(class));
                    if tx.send(class).is_err() {
                        return;
                    }
                }
            }
            warn!("cannot listen for SIGTERM; stopping on Ctrl-C only");
        }
        while tokio::signal::ctrl_c().await.is_ok() {
            if tx.send(ErrorClass::Interrupted).is_err() {
                return;
            }
        }
    });
    rx
}

/// The signal's name, for messages.
pub fn name(class: ErrorClass) -> &'static str {
    match class {
        ErrorClass::Terminated => "SIGTERM",
        _ => "SIGINT",
    }
}

/// A file-size limit (`ulimit -f`, a container's RLIMIT_FSIZE) reached by a spill or data file
/// raises SIGXFSZ, whose default action kills the process with no message and no JSON. Ignored,
/// the write fails with EFBIG instead, and the run ends with exit 74 saying which limit to raise.
pub fn ignore_file_size_signal() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to SIG_IGN at startup, before any thread exists;
    // no handler runs, so nothing can observe a half-initialised state.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}
