//! `berth`: the command line. Thin: parsing, output and exit codes live here; every rule lives
//! in the library crates.
//!
//! - `cli` — the grammar (clap).
//! - `config` — the one module that reads environment variables.
//! - `app` — opening the store, the registry and the ledger for one invocation.
//! - `commands` — one module per verb family.
//! - `errors` — error → kind, exit code and hint.
//! - `output` — the versioned JSON envelope.
//! - `human` — tables, colour (terminals only) and the progress line.
//! - `duration` — `500ms` / `30s` / `5m` / `2h` / `1d`.

/// `println!` for stdout, through [`output::stdout_write`]: a reader that went away
/// (`berth … | head`) ends the output, never the command.
macro_rules! outln {
    () => {
        $crate::output::stdout_write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::stdout_write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` for stdout, through [`output::stdout_write`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::stdout_write(format_args!($($arg)*))
    };
}

/// `eprintln!` without its panic: a stderr that cannot be written (a pipe closed by `| head`
/// with `2>&1`) must not turn a finished command into a crash.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

mod app;
mod cli;
mod commands;
mod config;
mod duration;
mod errors;
mod human;
mod output;
mod serve;
mod stop;

use std::sync::Arc;

use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};

use crate::app::App;
use crate::cli::{Cli, Command};
use crate::errors::code;

fn main() {
    // The helper modes (the per-exec reaper, bwrap's unprivileged entry) come before any
    // parsing: they must start fast and never touch the store.
    if let Some(code) = berth_supervisor::helper_mode(&std::env::args_os().collect::<Vec<_>>()) {
        std::process::exit(code);
    }
    let cli = Cli::parse();
    // One request to one sandbox needs no worker threads (starting and joining them is a
    // measurable part of a short command); missions, benchmarks and verification run
    // concurrent work that must not stall behind one another.
    let runtime = if cli.command.runs_concurrent_work() {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
    .expect("tokio runtime starts");
    let mut exit = runtime.block_on(run(cli));
    if output::flush_stdout() && exit == code::OK {
        exit = code::INTERNAL;
    }
    // Do not wait for lingering blocking tasks: everything that must finish has finished.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    std::process::exit(exit);
}

enum Ending {
    Done(i32),
    Failed(anyhow::Error),
    Panicked(String),
    Signalled(i32, &'static str),
}

async fn run(cli: Cli) -> i32 {
    let json = cli.json;
    let name = cli.command.name();
    let config = match config::Config::from_process() {
        Ok(config) => config,
        Err(err) => return output::failure(json, name, &err),
    };
    // Commands that touch no state.
    match &cli.command {
        Command::Schema { which } => return commands::schema(json, which),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), "berth", &mut script);
            output::stdout_write_bytes(&script);
            return 0;
        }
        Command::Providers => return finish(json, name, commands::providers(&config, json)),
        Command::Gateway(args) => {
            return finish(
                json,
                name,
                commands::gateway::run(&config, json, args).await,
            )
        }
        Command::Catalog(command) => {
            return finish(json, name, commands::catalog::run(&config, json, command))
        }
        Command::Provider(command) => {
            return finish(json, name, commands::scaffold::run(json, command))
        }
        _ => {}
    }
    let app = match App::open(config, json).await {
        Ok(app) => Arc::new(app),
        Err(err) => return output::failure(json, name, &err),
    };
    let (mut interrupt, mut terminate) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        _ => {
            return output::failure(
                json,
                name,
                &anyhow::anyhow!("cannot install signal handlers"),
            )
        }
    };
    // A command's own exit code passes through only when one runs in the foreground.
    let passes_exit_code = match &cli.command {
        Command::Exec(args) => !args.detach,
        Command::Run(_) | Command::Ssh(_) => true,
        _ => false,
    };
    let winds_down = matches!(&cli.command, Command::Prompt(_));
    let mut task = tokio::spawn(commands::dispatch(app.clone(), cli.command));
    let ending = tokio::select! {
        joined = &mut task => match joined {
            Ok(Ok(code)) => Ending::Done(code),
            Ok(Err(err)) => Ending::Failed(err),
            Err(join) => Ending::Panicked(join.to_string()),
        },
        _ = interrupt.recv() => {
            stop::request("SIGINT");
            Ending::Signalled(code::INTERRUPTED, "interrupted")
        }
        _ = terminate.recv() => {
            stop::request("SIGTERM");
            Ending::Signalled(code::TERMINATED, "terminated")
        }
    };
    // A command that winds down on a signal itself (`prompt` stops its agent and keeps the
    // turn) is given the time to; a second signal, or 90 seconds, cuts it short.
    let ending = match ending {
        Ending::Signalled(..) if winds_down => tokio::select! {
            joined = &mut task => match joined {
                Ok(Ok(code)) => Ending::Done(code),
                Ok(Err(err)) => Ending::Failed(err),
                Err(join) => Ending::Panicked(join.to_string()),
            },
            _ = interrupt.recv() => ending,
            _ = terminate.recv() => ending,
            () = tokio::time::sleep(std::time::Duration::from_secs(90)) => ending,
        },
        ending => ending,
    };
    if let Ending::Signalled(..) = ending {
        // Dropping the command's future kills any process group it was running.
        task.abort();
        let _ = task.await;
    }
    match ending {
        Ending::Done(code) => code,
        Ending::Failed(err) => {
            app.cleanup_after_failure().await;
            let code = output::failure(json, name, &err);
            // exec and run pass the command's exit code through; berth's own failure must not
            // look like one of the command's codes — except a command that could not start,
            // which exits 127/126 as with `docker exec`.
            let not_started =
                matches!(code, code::COMMAND_NOT_FOUND | code::COMMAND_NOT_EXECUTABLE);
            if passes_exit_code && !not_started {
                code::EXEC_FAILED
            } else {
                code
            }
        }
        Ending::Panicked(message) => {
            app.cleanup_after_failure().await;
            output::failure(
                json,
                name,
                &anyhow::anyhow!("berth panicked ({message}); this is a bug"),
            )
            .max(code::INTERNAL)
        }
        Ending::Signalled(code, what) => {
            // The cleanup says what it removed and what it kept.
            errln!("berth: {what}");
            app.cleanup_after_failure().await;
            code
        }
    }
}

fn finish(json: bool, name: &str, result: anyhow::Result<i32>) -> i32 {
    match result {
        Ok(code) => code,
        Err(err) => output::failure(json, name, &err),
    }
}

impl Command {
    /// Whether the command runs concurrent work (a multi-threaded runtime), rather than one
    /// request at a time.
    fn runs_concurrent_work(&self) -> bool {
        matches!(
            self,
            Command::Mission(_)
                | Command::Bench(_)
                | Command::Verify(_)
                | Command::Demo
                | Command::Gateway(_)
                | Command::Serve { .. }
        )
    }

    fn name(&self) -> &'static str {
        match self {
            Command::Providers => "providers",
            Command::Create(_) => "create",
            Command::List(_) => "list",
            Command::Status { .. } => "status",
            Command::Exec(_) => "exec",
            Command::Cp { .. } => "cp",
            Command::Ls { .. } => "ls",
            Command::Ps { .. } => "ps",
            Command::Logs { .. } => "logs",
            Command::Kill { .. } => "kill",
            Command::Ssh(_) => "ssh",
            Command::Port(_) => "port",
            Command::Serve { .. } => "serve",
            Command::Token(cli::TokenCommand::Create { .. }) => "token create",
            Command::Token(cli::TokenCommand::List) => "token list",
            Command::Token(cli::TokenCommand::Revoke { .. }) => "token revoke",
            Command::Snapshot { .. } => "snapshot",
            Command::Fork { .. } => "fork",
            Command::Restore { .. } => "restore",
            Command::Move(_) => "move",
            Command::Checkpoint { .. } => "checkpoint",
            Command::Checkpoints => "checkpoints",
            Command::Sessions => "sessions",
            Command::Stop { .. } => "stop",
            Command::Start { .. } => "start",
            Command::Suspend { .. } => "suspend",
            Command::Resume { .. } => "resume",
            Command::Destroy { .. } => "destroy",
            Command::Run(_) => "run",
            Command::Ledger(cli::LedgerCommand::List { .. }) => "ledger list",
            Command::Ledger(cli::LedgerCommand::Sweep { .. }) => "ledger sweep",
            Command::Gc => "gc",
            Command::Demo => "demo",
            Command::Bench(_) => "bench",
            Command::Verify(_) => "verify",
            Command::Catalog(cli::CatalogCommand::Show { .. }) => "catalog show",
            Command::Catalog(cli::CatalogCommand::Check { .. }) => "catalog check",
            Command::Catalog(cli::CatalogCommand::Keygen { .. }) => "catalog keygen",
            Command::Provider(cli::ProviderCommand::New { .. }) => "provider new",
            Command::Mission(cli::MissionCommand::Run { .. }) => "mission run",
            Command::Mission(cli::MissionCommand::Resume { .. }) => "mission resume",
            Command::Mission(cli::MissionCommand::Cancel { .. }) => "mission cancel",
            Command::Mission(cli::MissionCommand::Status { .. }) => "mission status",
            Command::Mission(cli::MissionCommand::List) => "mission list",
            Command::Mission(cli::MissionCommand::Bench { .. }) => "mission bench",
            Command::Schema { .. } => "schema",
            Command::Completions { .. } => "completions",
            Command::Gateway(_) => "gateway",
            Command::Prompt(_) => "prompt",
            Command::Attempt(cli::AttemptCommand::Trajectory { .. }) => "attempt trajectory",
            Command::Attempt(cli::AttemptCommand::Watch { .. }) => "attempt watch",
            Command::Attempt(cli::AttemptCommand::Session { .. }) => "attempt session",
            Command::Mission(cli::MissionCommand::Watch { .. }) => "mission watch",
            Command::Artifacts(cli::ArtifactsCommand::Query { .. }) => "artifacts query",
            Command::Artifacts(cli::ArtifactsCommand::Export { .. }) => "artifacts export",
            #[cfg(feature = "iceberg")]
            Command::Artifacts(cli::ArtifactsCommand::Iceberg) => "artifacts iceberg",
            Command::Artifacts(cli::ArtifactsCommand::Show { .. }) => "artifacts show",
            Command::Artifacts(cli::ArtifactsCommand::Get { .. }) => "artifacts get",
            Command::Artifacts(cli::ArtifactsCommand::Reconcile { .. }) => "artifacts reconcile",
        }
    }
}
