//! `berth gateway`: the model gateway on its own, for users' own tests.

use anyhow::{Context, Result};
use berth_gateway::{Gateway, GatewayConfig, GatewayError, Prices, Proxy, Script, Upstream};
use serde_json::json;
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::GatewayArgs;
use crate::config::Config;
use crate::errors::CliError;
use crate::output::emit;

fn invalid(err: GatewayError) -> anyhow::Error {
    let hint = match &err {
        GatewayError::Script(_) => "see the README's \"Model gateway\" section for the format",
        GatewayError::Prices(_) => "prices are US dollars per million tokens, finite, >= 0",
        GatewayError::Proxy(_) => "give `--proxy http://HOST:PORT --credential-env VAR`",
        GatewayError::Listen(_) => "choose another `--port`, or 0 for any free one",
    };
    CliError::invalid(err.to_string(), hint).into()
}

/// The largest price table read (real ones are a few KiB).
const MAX_PRICE_TABLE_BYTES: u64 = 1 << 20;

fn load_prices(path: &std::path::Path) -> Result<Prices> {
    let bytes = berth_files::read_regular(path, MAX_PRICE_TABLE_BYTES)
        .with_context(|| format!("cannot read the price table {}", path.display()))?;
    let text = String::from_utf8(bytes).map_err(|_| {
        CliError::invalid(
            format!("the price table {} is not UTF-8 text", path.display()),
            "",
        )
    })?;
    let prices: Prices =
        toml::from_str(&text).map_err(|e| invalid(GatewayError::Prices(e.to_string())))?;
    prices.check().map_err(invalid)?;
    Ok(prices)
}

/// The upstream `--script FILE` or `--proxy URL --credential-env VAR` names.
pub fn upstream(
    config: &Config,
    script: Option<&std::path::Path>,
    proxy: Option<&str>,
    credential_env: Option<&str>,
) -> Result<Upstream> {
    Ok(match (script, proxy) {
        (Some(path), _) => Upstream::Scripted(Script::load(path).map_err(invalid)?.into()),
        (None, Some(origin)) => {
            let variable = credential_env.unwrap_or_default();
            let credential = config.env.get(variable).unwrap_or_default().to_owned();
            if credential.is_empty() {
                return Err(CliError::invalid(
                    format!("`{variable}` is not set (the proxy's credential)"),
                    "export the credential in that variable; it never goes in argv",
                )
                .into());
            }
            let proxy = Proxy::new(origin, credential)
                .and_then(|p| p.trust_configured(config.env.get(berth_gateway::PROXY_CA_FILE_VAR)))
                .map_err(invalid)?;
            Upstream::Proxy(proxy.into())
        }
        (None, None) => {
            return Err(CliError::invalid(
                "no model: give `--script FILE` or `--proxy URL --credential-env VAR`",
                "`berth gateway --help` describes both",
            )
            .into())
        }
    })
}

/// Runs until SIGINT or SIGTERM; prints where it listens, the attempt token and the journal.
pub async fn run(config: &Config, json: bool, args: &GatewayArgs) -> Result<i32> {
    // Before anything is printed: a SIGTERM sent as soon as the address is known must stop
    // the gateway cleanly, not kill it.
    let (mut interrupt, mut terminate) = (
        signal(SignalKind::interrupt())?,
        signal(SignalKind::terminate())?,
    );
    let upstream = upstream(
        config,
        args.script.as_deref(),
        args.proxy.as_deref(),
        args.credential_env.as_deref(),
    )?;
    let prices = args.prices.as_deref().map(load_prices).transpose()?;
    let journal = match args.journal.clone() {
        Some(path) => path,
        None => {
            let dir = config.state_dir().join("gateway");
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            dir.join(format!("journal-{}.jsonl", std::process::id()))
        }
    };
    let gateway = Gateway::new(GatewayConfig { upstream, prices });
    let token = gateway.admit(&args.attempt, journal.clone());
    let running = gateway.listen(args.port).await.map_err(invalid)?;
    if json {
        emit(
            "gateway",
            json!({
                "listening": running.base_url(),
                "token": token.expose(),
                "journal": journal,
            }),
        );
    } else {
        outln!("LISTENING {}", running.base_url());
        outln!("TOKEN {}", token.expose());
        outln!("JOURNAL {}", journal.display());
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    running.stop();
    Ok(0)
}
