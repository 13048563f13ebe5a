//! `berth prompt ID --harness NAME "instructions"`: an agent CLI in an existing sandbox, its
//! model traffic through a gateway of this process, its normalized events streamed as they
//! arrive.
//!
//! A sandbox on the host's network reaches the gateway's port; an isolated one (docker) a
//! loopback port inside it that its provider forwards here, and runs its image's CLIs
//! (`berth/agent-clis:bookworm`). The sandbox gets the gateway's address and a token for this one run (revoked when the agent
//! stops), never a model credential. The raw log, the events and the gateway's journal are kept
//! under `$BERTH_HOME/state/prompts/<sandbox>-<time>/`. Exit 0 when the agent finished its turn
//! without error and did something; 12 otherwise (the judgement is printed).

use anyhow::Result;
use berth_contract::{ExecRequest, OutputSink, Stream};
use berth_gateway::{Gateway, GatewayConfig};
use berth_harness::{judge, launch, vars, Harness, Normalizer};
use serde_json::json;

use crate::app::App;
use crate::cli::PromptArgs;
use crate::errors::{code, CliError};

/// Prints each normalized event as its line completes, and keeps the raw log.
struct Live {
    json: bool,
    normalizer: Normalizer,
    events: Vec<berth_harness::Event>,
    raw: std::fs::File,
    events_file: std::fs::File,
}

impl OutputSink for Live {
    fn chunk(&mut self, stream: Stream, bytes: &[u8]) {
        use std::io::Write;
        if stream != Stream::Stdout {
            return;
        }
        let _ = self.raw.write_all(bytes);
        let events = self.normalizer.push(bytes);
        self.show(events);
    }
}

impl Live {
    fn show(&mut self, events: Vec<berth_harness::Event>) {
        use std::io::Write;
        for event in events {
            let line = serde_json::to_string(&event).expect("events serialize");
            let _ = writeln!(self.events_file, "{line}");
            if self.json {
                outln!("{line}");
            } else {
                let value = serde_json::to_value(&event).expect("events serialize");
                outln!("{}", super::watch::human(&value));
            }
            self.events.push(event);
        }
    }
}

fn private_file(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// `berth prompt`.
pub async fn prompt(app: &App, args: PromptArgs) -> Result<i32> {
    let harness = Harness::parse(&args.harness).expect("clap checked the name");
    let timeout = crate::duration::parse(&args.timeout)?;
    let (_, provider, native) = app.sandbox(&args.id).await?;
    let reach = berth_orchestrator::GatewayReach::of(app.registry.manifest(provider.id())?)
        .map_err(|why| CliError {
            kind: "unsupported",
            exit_code: code::UNSUPPORTED,
            message: why,
            hint: Some(
                "use a host sandbox, or a docker one from berth/agent-clis:bookworm \
                 (scripts/build-agent-clis-image.sh)"
                    .into(),
            ),
        })?;
    let bin = berth_orchestrator::agent_bin_dir(&app.config.env, reach, harness)
        .map_err(|why| CliError::not_found(why, "scripts/install-agent-clis"))?;
    let upstream = super::gateway::upstream(
        &app.config,
        args.script.as_deref(),
        args.proxy.as_deref(),
        args.credential_env.as_deref(),
    )?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let dir = app
        .config
        .state_dir()
        .join("prompts")
        .join(format!("{}-{stamp}", args.id));
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
    }
    let gateway = Gateway::new(GatewayConfig {
        upstream,
        prices: None,
    });
    let key = format!("prompt-{}-{stamp}", args.id);
    let token = gateway.admit(&key, dir.join("gateway.jsonl"));
    let running = gateway.listen(0).await?;
    let link =
        berth_orchestrator::link_gateway(provider.as_ref(), &native, reach, &running).await?;
    let mut req = ExecRequest::shell(launch(harness))
        .with_cwd(args.cwd.clone())
        .with_timeout(timeout)
        .with_env(vars::BIN, bin)
        .with_env(vars::GATEWAY_URL, link.url.clone())
        .with_env(vars::GATEWAY_TOKEN, token.expose().to_owned())
        .with_env(vars::MODEL, args.model.clone())
        .with_env(vars::INSTRUCTIONS, args.instructions.clone());
    req.max_output_bytes = 64 << 20;
    let mut live = Live {
        json: app.json,
        normalizer: Normalizer::new(harness, &key, "agent.jsonl"),
        events: Vec::new(),
        raw: private_file(&dir.join("agent.jsonl"))?,
        events_file: private_file(&dir.join("events.jsonl"))?,
    };
    let status = match provider.streaming() {
        Some(streaming) => {
            streaming
                .exec_streaming(&native, &req, &mut live)
                .await?
                .status
        }
        None => {
            let out = provider.exec(&native, &req).await?;
            live.chunk(Stream::Stdout, &out.stdout);
            out.status
        }
    };
    gateway.revoke(&token);
    drop(link);
    let last = live.normalizer.finish();
    live.show(last);
    let judged = judge(harness, &live.events);
    let verdict = match &judged.verdict {
        Ok(()) => None,
        Err(why) => Some(why.clone()),
    };
    if app.json {
        outln!(
            "{}",
            json!({
                "schema": berth_harness::EVENTS_SCHEMA,
                "kind": "prompt_finished",
                "harness": harness.as_str(),
                "exit": status,
                "tool_calls": judged.tool_calls,
                "session_id": judged.session_id,
                "rejected": verdict,
                "logs": dir,
            })
        );
    } else {
        match &verdict {
            None => outln!(
                "berth: {} finished its turn ({} tool calls; {status}); logs in {}",
                harness.as_str(),
                judged.tool_calls,
                dir.display()
            ),
            Some(why) => outln!("berth: {why}; logs in {}", dir.display()),
        }
    }
    Ok(if verdict.is_none() {
        code::OK
    } else {
        code::VERIFICATION_FAILED
    })
}
