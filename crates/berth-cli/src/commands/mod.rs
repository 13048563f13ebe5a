//! One module per verb family. Each command returns its exit code.

mod access;
mod artifacts;
pub mod catalog;
pub(crate) mod copy;
mod demo;
pub(crate) mod exec;
pub mod gateway;
pub(crate) mod ledger;
pub(crate) mod mission;
pub(crate) mod moving;
pub(crate) mod prompt;
pub(crate) mod sandbox;
pub mod scaffold;
pub mod verify;
mod watch;

use std::sync::Arc;

use anyhow::Result;
use berth_contract::{Capability, Support};
use serde_json::json;

use crate::app::App;
use crate::cli::{Command, LedgerCommand};
use crate::config::Config;
use crate::errors::code;
use crate::output::emit;

/// Runs a stateful command.
pub async fn dispatch(app: Arc<App>, command: Command) -> Result<i32> {
    match command {
        Command::Create(args) => sandbox::create(&app, args).await,
        Command::List(args) => sandbox::list(&app, args.all).await,
        Command::Status { id } => sandbox::status(&app, &id).await,
        Command::Snapshot { id, ttl } => sandbox::snapshot(&app, &id, ttl.as_deref()).await,
        Command::Gc => ledger::sweep(&app, None, true, false).await,
        Command::Fork { id, ttl } => sandbox::fork(&app, &id, &ttl.ttl).await,
        Command::Restore {
            handle,
            provider,
            image,
            ttl,
        } if handle.starts_with(berth_portable::CHECKPOINT_PREFIX) => {
            moving::restore_checkpoint(&app, &handle, &provider, image, &ttl.ttl).await
        }
        Command::Restore {
            handle,
            provider,
            image,
            ttl,
        } => {
            if image.is_some() {
                return Err(crate::errors::CliError::invalid(
                    "`--image` is for restoring a checkpoint (`ws-…`); a provider's snapshot is \
                     its own image"
                        .to_owned(),
                    "leave `--image` out",
                )
                .into());
            }
            sandbox::restore(&app, &handle, &provider, &ttl.ttl).await
        }
        Command::Checkpoint { id, ttl } => moving::checkpoint(&app, &id, ttl.as_deref()).await,
        Command::Checkpoints => moving::checkpoints(&app).await,
        Command::Sessions => prompt::sessions(&app).await,
        Command::Destroy { ids } => sandbox::destroy(&app, &ids).await,
        Command::Move(args) => moving::move_sandbox(&app, args).await,
        Command::Stop { id } => sandbox::power(&app, &id, sandbox::Power::Stop).await,
        Command::Start { id } => sandbox::power(&app, &id, sandbox::Power::Start).await,
        Command::Suspend { id } => sandbox::power(&app, &id, sandbox::Power::Suspend).await,
        Command::Resume { id } => sandbox::power(&app, &id, sandbox::Power::Resume).await,
        Command::Exec(args) => exec::exec(&app, args).await,
        Command::Ps { id } => exec::ps(&app, &id).await,
        Command::Logs { id, handle, follow } => exec::logs(&app, &id, &handle, follow).await,
        Command::Kill { id, handle } => exec::kill(&app, &id, &handle).await,
        Command::Ssh(args) => access::ssh(&app, args).await,
        Command::Serve {
            listen,
            allow_unisolated,
            prompt_proxy,
            prompt_credential_env,
        } => {
            let options = crate::serve::Options {
                allow_unisolated,
                prompt_proxy: prompt_proxy.zip(prompt_credential_env).map(
                    |(origin, credential_env)| crate::serve::PromptProxy {
                        origin,
                        credential_env,
                    },
                ),
            };
            crate::serve::run(&app, listen, options).await
        }
        Command::Token(command) => {
            let store = app.ledger.store();
            match command {
                crate::cli::TokenCommand::Create { owner, scope, name } => {
                    crate::serve::auth::create(store, app.json, &owner, &scope, &name).await
                }
                crate::cli::TokenCommand::List => crate::serve::auth::list(store, app.json).await,
                crate::cli::TokenCommand::Revoke { id } => {
                    crate::serve::auth::revoke(store, app.json, &id).await
                }
            }
        }
        Command::Port(args) => access::port(&app, args).await,
        Command::Run(args) => exec::run(&app, args).await,
        Command::Cp {
            source,
            destination,
        } => copy::cp(&app, &source, &destination).await,
        Command::Ls { target } => match target.split_once(':') {
            Some((id, path)) => copy::ls(&app, id, path).await,
            None => copy::ls(&app, &target, ".").await,
        },
        Command::Ledger(LedgerCommand::List { all }) => ledger::list(&app, all).await,
        Command::Ledger(LedgerCommand::Sweep {
            run,
            expired,
            no_discover,
        }) => ledger::sweep(&app, run, expired, !no_discover).await,
        Command::Demo => demo::demo(&app).await,
        Command::Bench(args) if args.providers == ["artifacts"] => report(
            &app,
            "bench",
            berth_bench::artifacts::bench(&app.bench_context()?, args.iterations.unwrap_or(3))
                .await?,
        ),
        Command::Bench(args) if args.providers == ["gateway"] => report(
            &app,
            "bench",
            berth_bench::gateway::bench(&app.bench_context()?, args.iterations).await?,
        ),
        Command::Bench(args) if args.providers.first().is_some_and(|p| p == "bridge") => report(
            &app,
            "bench",
            berth_bench::bridge::bench(
                &app.bench_context()?,
                args.providers.get(1).map(String::as_str),
                args.iterations,
            )
            .await?,
        ),
        Command::Bench(args) if args.providers == ["serve"] => report(
            &app,
            "bench",
            berth_bench::serve::bench(
                &app.bench_context()?,
                args.concurrency,
                crate::duration::parse(args.duration.as_deref().unwrap_or("30s"))?,
            )
            .await?,
        ),
        Command::Bench(args) if args.providers.first().is_some_and(|p| p == "move") => report(
            &app,
            "bench",
            berth_bench::moving::bench(
                &app.bench_context()?,
                &args.providers[1..],
                args.image.as_deref(),
                args.iterations,
            )
            .await?,
        ),
        Command::Bench(args) if args.providers.first().is_some_and(|p| p == "resume") => report(
            &app,
            "bench",
            berth_bench::sessions::bench(
                &app.bench_context()?,
                &args.providers[1..],
                args.image.as_deref(),
                args.iterations,
            )
            .await?,
        ),
        Command::Bench(args) if args.providers.first().is_some_and(|p| p == "monitor") => report(
            &app,
            "bench",
            berth_bench::monitor::bench(
                &app.bench_context()?,
                &args.providers[1..],
                args.image.as_deref(),
            )
            .await?,
        ),
        Command::Bench(args) if args.raw => {
            let options = berth_bench::raw::RawOptions {
                providers: args.providers,
                iterations: args.iterations,
                image: args.image,
            };
            report(
                &app,
                "bench",
                berth_bench::raw::bench(&app.bench_context()?, options).await?,
            )
        }
        Command::Bench(args) => {
            let options = berth_bench::lifecycle::LifecycleOptions {
                providers: args.providers,
                iterations: args.iterations,
                image: args.image,
                mode: args.mode,
                concurrency: args.concurrency,
                stagger_ms: args.stagger_ms,
                out: args.out,
            };
            let done = berth_bench::lifecycle::bench(app.bench_context()?, options).await?;
            report(&app, "bench", done)
        }
        Command::Verify(args) => verify::verify(&app, args).await,
        Command::Mission(crate::cli::MissionCommand::Bench {
            attempts,
            concurrency,
        }) => {
            let done =
                berth_bench::mission::bench(app.bench_context()?, attempts, concurrency).await?;
            report(&app, "mission bench", done)
        }
        Command::Prompt(args) => prompt::prompt(&app, args).await,
        Command::Mission(crate::cli::MissionCommand::Watch { id, watch }) => {
            watch::mission(&app, &id, &watch).await
        }
        Command::Mission(command) => mission::run(&app, command).await,
        Command::Attempt(crate::cli::AttemptCommand::Watch { key, watch }) => {
            watch::attempt(&app, &key, &watch).await
        }
        Command::Attempt(crate::cli::AttemptCommand::Session { key }) => {
            prompt::attempt_session(&app, &key).await
        }
        Command::Attempt(command) => mission::attempt(&app, command).await,
        Command::Artifacts(command) => artifacts::run(&app, command).await,
        Command::Providers
        | Command::Schema { .. }
        | Command::Completions { .. }
        | Command::Catalog(_)
        | Command::Provider(_)
        | Command::Gateway(_) => {
            unreachable!("handled without state")
        }
    }
}

/// Prints a benchmark's report: its JSON document with `--json`, else its text.
fn report(app: &App, command: &str, report: berth_bench::Report) -> Result<i32> {
    if app.json {
        emit(command, report.json);
    } else {
        out!("{}", report.text);
    }
    Ok(code::OK)
}

/// `berth schema manifest`.
pub fn schema(_json: bool, which: &str) -> i32 {
    match which {
        "evidence" => out!("{}", berth_evidence::json_schema()),
        "mission" => out!("{}", berth_mission::file::json_schema()),
        "events" => out!("{}", berth_harness::json_schema()),
        "bundle" => out!("{}", berth_artifacts::bundle::json_schema()),
        "openapi" => out!("{}", crate::serve::openapi_json()),
        _ => out!("{}", berth_manifest::json_schema()),
    }
    code::OK
}

fn support_str(support: Support) -> &'static str {
    match support {
        Support::Supported => "supported",
        Support::Unsupported => "unsupported",
        Support::Unknown => "unknown",
    }
}

/// `berth providers`.
pub fn providers(config: &Config, json: bool) -> Result<i32> {
    let registry = berth_factory::Registry::builtin()?;
    let mut rows = Vec::new();
    for manifest in registry.manifests()? {
        let missing = registry.missing_credentials(&manifest.id, &config.env);
        let capabilities: serde_json::Map<_, _> = Capability::ALL
            .iter()
            .map(|c| {
                (
                    c.as_str().to_owned(),
                    json!(support_str(manifest.support(*c))),
                )
            })
            .collect();
        rows.push(json!({
            "id": manifest.id,
            "display_name": manifest.display_name,
            "isolation": manifest.isolation.class,
            "isolation_statement": manifest.isolation.statement,
            "adapter_built_in": registry.has_adapter(&manifest.id),
            "missing_credentials": missing,
            "capabilities": capabilities,
        }));
    }
    if json {
        emit("providers", json!({ "providers": rows }));
        return Ok(code::OK);
    }
    for manifest in registry.manifests()? {
        let adapter = if registry.has_adapter(&manifest.id) {
            "adapter built in"
        } else {
            "catalog only"
        };
        outln!(
            "{} — {} ({adapter}; isolation: {:?})",
            manifest.id,
            manifest.display_name,
            manifest.isolation.class
        );
        outln!("  {}", manifest.isolation.statement.replace('\n', " "));
        for capability in Capability::ALL {
            outln!(
                "  {:<20} {}",
                capability.as_str(),
                support_str(manifest.support(capability))
            );
        }
        let missing = registry.missing_credentials(&manifest.id, &config.env);
        if !missing.is_empty() {
            outln!("  missing credentials: {}", missing.join(", "));
        }
    }
    Ok(code::OK)
}
