//! `warren`: sandboxes and workspaces for AI agents.
//!
//! This binary only parses arguments and dispatches; every rule lives in the library crates.
//! `warren serve` runs the provisioner; the other subcommands are clients of a running
//! server, found through `WARREN_URL` and `WARREN_TOKEN`.

mod cmd;
mod settings;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // A runtime launcher is this same executable, re-run by the local backend; it must not
    // start an async runtime or threads before it forks (see warren_isolation::runtime).
    if std::env::args_os().nth(1).as_deref() == Some(warren_isolation::RUNTIME_INIT_ARG.as_ref()) {
        warren_isolation::runtime_init_main();
    }
    // The same for the agent inside a Docker container: a single-threaded fork server.
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() == Some(warren_agent::CONTAINER_AGENT_ARG.as_ref()) {
        let config = args.next().unwrap_or_default();
        warren_agent::container_agent_main(&config.to_string_lossy());
    }
    // The steps of a Kubernetes sandbox pod's init containers (warren's image): no async
    // runtime needed, and none wanted as root in the pod.
    let mut args = std::env::args_os().skip(1);
    match args.next() {
        Some(arg) if arg == warren_kubernetes::AGENT_BUNDLE_ARG => {
            let dir = std::path::PathBuf::from(args.next().unwrap_or_default());
            let written = std::env::current_exe()
                .and_then(|program| warren_agent::bundle::write_into(&program, &dir));
            return match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!(
                        "warren: cannot write the agent bundle into {}: {error}",
                        dir.display()
                    );
                    ExitCode::from(1)
                }
            };
        }
        Some(arg) if arg == warren_kubernetes::PREPARE_ARG => {
            let config = args.next().unwrap_or_default();
            let code = warren_kubernetes::prepare_main(&config.to_string_lossy());
            return ExitCode::from(u8::try_from(code).unwrap_or(1));
        }
        _ => {}
    }
    let cli = cmd::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("warren: could not start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    let outcome = runtime.block_on(cmd::run(cli));
    // Dropping the runtime would wait for every blocking thread; one still copying or
    // snapshotting (it observes the provisioner's cancel flag, but a syscall may be slow)
    // must not keep a stopping server alive.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match outcome {
        Ok(code) => code,
        // The reader of stdout has what it wanted (`warren openapi | head`).
        Err(error) if cmd::output::closed_stdout(&error) => {
            ExitCode::from(cmd::output::CLOSED_STDOUT_STATUS)
        }
        Err(error) => {
            eprintln!("warren: {error:#}");
            ExitCode::from(1)
        }
    }
}
