//! The binary: parse, set up logging, run the command, map the error to an exit code.

use clap::Parser;
use tidemark::cli::{wants_json, Cli, OutputFormat};
use tidemark::error::{json_failure, Classify, ErrorClass};

fn main() {
    tidemark::signal::ignore_file_size_signal();
    let raw: Vec<String> = std::env::args().collect();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            if !e.use_stderr() {
                let _ = e.print();
                std::process::exit(0);
            }
            if wants_json(&raw) {
                let text = e.to_string();
                let message = text.trim().trim_start_matches("error: ");
                write_stdout(&json_failure("", ErrorClass::Usage, message));
            }
            let _ = e.print();
            std::process::exit(ErrorClass::Usage.exit_code());
        }
    };
    tidemark::logging::init(cli.log_format, cli.level(), cli.is_quiet_service());
    quiet_upstream_abort_panic();
    let json = cli.command.output() == OutputFormat::Json;
    // `hints`: an error (not a job or bundle report that failed) gets the bug / retry advice.
    let fail = |stdout: &str, class: ErrorClass, message: &str, hints: bool| -> ! {
        if json {
            write_stdout(&json_failure(stdout, class, message));
        } else {
            write_stdout(stdout);
        }
        eprintln!("error: {message}");
        if hints && class == ErrorClass::Internal {
            eprintln!("this looks like a bug in tidemark; please report it with the log above");
        }
        if hints && class.is_retryable() {
            eprintln!(
                "this failure is transient (exit {}): rerun the same command; a rerun is harmless",
                class.exit_code()
            );
        }
        std::process::exit(class.exit_code());
    };
    let clock = match tidemark::clock::from_env() {
        Ok(c) => c,
        Err(msg) => fail("", ErrorClass::Usage, &msg, false),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => fail(
            "",
            ErrorClass::Internal,
            &format!("cannot start the async runtime: {e}"),
            false,
        ),
    };
    // A panic anywhere is a bug, but still a documented exit (70) with its message — and with
    // `--output json` its one JSON object — never the runtime's bare 101.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime
            .block_on(tidemark::app::dispatch(cli.command, clock))
            .map_err(Box::new)
    }));
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            fail(
                "",
                ErrorClass::Internal,
                &format!("internal error (a bug in tidemark or a library it uses, not in your data or setup): {what}"),
                true,
            )
        }
    };
    match outcome {
        Ok(out) => match out.failure {
            Some((class, message)) => fail(&out.stdout, class, &message, false),
            None => write_stdout(&out.stdout),
        },
        Err(e) => fail(e.stdout().unwrap_or(""), e.class(), &e.to_string(), true),
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
