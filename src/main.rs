//! The binary: parse, set up logging, run the command, map the error to an exit code.

use clap::Parser;
use tidemark::cli::Cli;
use tidemark::error::{Classify, ErrorClass};

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                ErrorClass::Usage.exit_code()
            } else {
                0
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    tidemark::logging::init(cli.log_format, cli.level());
    quiet_upstream_abort_panic();
    let clock = match tidemark::clock::from_env() {
        Ok(c) => c,
        Err(msg) => {
            eprintln!("error: {msg}");
            std::process::exit(ErrorClass::Usage.exit_code());
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(ErrorClass::Internal.exit_code());
        }
    };
    match runtime.block_on(tidemark::app::dispatch(cli.command, clock)) {
        Ok(out) => {
            write_stdout(&out.stdout);
            if let Some((class, message)) = out.failure {
                eprintln!("error: {message}");
                std::process::exit(class.exit_code());
            }
        }
        Err(e) => {
            if let Some(stdout) = e.stdout() {
                write_stdout(stdout);
            }
            let class = e.class();
            eprintln!("error: {e}");
            if class == ErrorClass::Internal {
                eprintln!("this looks like a bug in tidemark; please report it with the log above");
            }
            if class.is_retryable() {
                eprintln!("this failure is transient (exit {}): rerun the same command; a rerun is harmless", class.exit_code());
            }
            std::process::exit(class.exit_code());
        }
    }
}

/// When a write to a table fails (a full disk, a refused permission), delta-rs aborts the data
/// file's upload, and `object_store`'s buffered writer panics "Already shut down" if the failed
/// upload had already been shut down; delta-rs catches that panic and reports the write's own
/// error, which decides the exit code. The default hook would still print "thread panicked" above
/// the real message, as if tidemark had crashed: that one known, caught panic is logged at debug
/// level instead. Every other panic is printed as before.
fn quiet_upstream_abort_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str));
        let upstream_abort = message == Some("Already shut down")
            && info.location().is_some_and(|l| {
                l.file().contains("object_store") && l.file().ends_with("buffered.rs")
            });
        if upstream_abort {
            tracing::debug!(location = %info.location().map(|l| l.to_string()).unwrap_or_default(), "object_store: aborting an upload that had already failed (caught by delta-rs)");
            return;
        }
        default(info);
    }));
}

/// Prints a command's output. A reader that went away (`tidemark reconcile ... | head`) is not an
/// error of the command; any other failure to write is local I/O (exit 74), never a panic.
fn write_stdout(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => {
            eprintln!("error: cannot write the output to stdout: {e}");
            std::process::exit(ErrorClass::Io.exit_code());
        }
    }
}
