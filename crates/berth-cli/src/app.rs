//! One invocation's context: configuration, registry, store and ledger.

use std::sync::Arc;

use anyhow::{Context, Result};
use berth_contract::{NativeId, Provider};
use berth_factory::{ProviderConfig, Registry};
use berth_ledger::{new_run_id, Ledger};
use berth_store::{LedgerRow, LedgerState, Store};

use crate::config::Config;
use crate::errors::CliError;

/// The context of one `berth` invocation.
#[derive(Debug)]
pub struct App {
    /// This invocation's configuration. In a request of `berth serve`, its environment is
    /// empty: the names a caller gives (`--env NAME`) read nothing of the server's.
    pub config: Config,
    /// The process's own environment, for Berth's own settings — the artifact store and its
    /// keys, where the agent CLIs are — never read by a name a request gives.
    pub settings: berth_factory::Environment,
    pub registry: Registry,
    pub provider_config: ProviderConfig,
    pub ledger: Ledger,
    pub json: bool,
}

/// Keeps what Berth stores private to its user: `BERTH_HOME` is created mode 0700 (and
/// tightened when it is empty or Berth's own), and whatever else it holds, Berth's own parts —
/// `state/` (workspaces, and docker's bind-mounted socket directories, where a sandbox can leave
/// a setuid-root binary), `missions/` (bundles) and the store — are made 0700/0600, so no other
/// user reaches them. A directory that is not Berth's is never changed.
fn private_home(home: &std::path::Path, state: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let private_already =
        |m: &std::fs::Metadata| m.is_dir() && m.permissions().mode() & 0o777 == 0o700;
    let private_dir = |dir: &std::path::Path| -> Result<()> {
        // Most starts find it there and private already: one stat, no mkdir or chmod.
        if std::fs::metadata(dir).is_ok_and(|m| private_already(&m)) {
            return Ok(());
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| {
                crate::errors::CliError::setup(
                    format!("cannot create {}: {e}", dir.display()),
                    &format!(
                        "BERTH_HOME ({}) must be a directory Berth can create and write",
                        home.display()
                    ),
                )
            })?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot make {} private", dir.display()))
    };
    // Berth makes its home private only when it makes it (missing or empty). A directory that
    // already holds other files — a shared one — is left as it is, at every start: not only
    // until Berth's own store appears in it.
    let fresh = match std::fs::metadata(home) {
        Err(_) => true,
        Ok(m) if private_already(&m) => false,
        Ok(_) => std::fs::read_dir(home).is_ok_and(|mut d| d.next().is_none()),
    };
    if fresh {
        private_dir(home)?;
    }
    private_dir(state)?;
    private_dir(&home.join("missions"))?;
    private_store(home)
}

/// The store's files, mode 0600 (SQLite creates them with the default mode).
fn private_store(home: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for store in ["berth.db", "berth.db-wal", "berth.db-shm"] {
        let path = home.join(store);
        if std::fs::metadata(&path)
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o777 != 0o600)
        {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("cannot make {} private", path.display()))?;
        }
    }
    Ok(())
}

impl App {
    /// Creates the state directory if needed (private) and opens the store.
    pub async fn open(config: Config, json: bool) -> Result<App> {
        private_home(&config.home, &config.state_dir())?;
        let store = Store::open(&config.database()).await?;
        private_store(&config.home)?;
        App::with_store(config, store, json)
    }

    /// An app over an open store: the builtin registry, providers configured from `config`
    /// (its environment carries their credentials), a ledger with a run id of its own.
    fn with_store(config: Config, store: Store, json: bool) -> Result<App> {
        let registry = Registry::builtin()?;
        let provider_config = ProviderConfig {
            state_dir: config.state_dir(),
            env: config.env.clone(),
            // The reaper when there is no supervisor: `berth` itself (`berth __reap …`); the
            // factory prefers the supervisor when it builds a local provider.
            reaper: std::env::current_exe().ok(),
        };
        let ledger = Ledger::new(store, config.owner.clone(), new_run_id());
        Ok(App {
            settings: config.env.clone(),
            config,
            registry,
            provider_config,
            ledger,
            json,
        })
    }

    /// An app for one request of `berth serve`: the server's store, the owner in `config`, a
    /// run id of its own, JSON documents. The providers get the server's environment (their
    /// credentials), as do Berth's own settings (`settings`: the artifact store the server is
    /// configured with); the request's own `--env NAME` lookups get an empty one, so no caller
    /// can read the server's variables into a sandbox.
    pub fn for_request(config: Config, store: Store) -> Result<App> {
        let mut app = App::with_store(config, store, true)?;
        app.config.env = berth_factory::Environment::empty();
        Ok(app)
    }

    /// What a benchmark reads: this invocation's providers, ledger and home.
    pub fn bench_context(&self) -> Result<berth_bench::BenchContext> {
        Ok(berth_bench::BenchContext {
            registry: std::sync::Arc::new(Registry::builtin()?),
            provider_config: self.provider_config.clone(),
            ledger: self.ledger.clone(),
            home: self.config.home.clone(),
            berth: std::env::current_exe()?,
            progress: {
                let line = std::sync::Arc::new(crate::human::Progress::new(self.json));
                berth_bench::ProgressHook::new(move |message| line.show(message))
            },
        })
    }

    /// The object store checkpoints, agent sessions and bundles are kept in: the one this
    /// process is configured with (`BERTH_ARTIFACTS_URL`), else `$BERTH_HOME/artifacts`.
    pub fn objects(&self) -> Result<berth_artifacts::Objects> {
        Ok(berth_orchestrator::publication::objects(
            &self.config.home,
            &self.settings,
        )?)
    }

    /// Constructs a provider.
    pub fn provider(&self, id: &str) -> Result<Arc<dyn Provider>> {
        Ok(self.registry.construct(id, &self.provider_config)?)
    }

    /// A sandbox of this owner that is not gone: its ledger row, provider and native id.
    pub async fn sandbox(&self, id: &str) -> Result<(LedgerRow, Arc<dyn Provider>, NativeId)> {
        let (row, provider) = self.row(id).await?;
        if row.kind != berth_store::ResourceKind::Sandbox {
            return Err(CliError::invalid(
                format!("`{id}` is a snapshot, not a sandbox"),
                "`berth restore HANDLE` makes a sandbox from it; `berth destroy` deletes it",
            )
            .into());
        }
        let native = berth_ledger::native_id(&row);
        Ok((row, provider, native))
    }

    /// A ledger row of this owner (a sandbox or a snapshot) that is not verified gone, and its
    /// provider.
    pub async fn row(&self, id: &str) -> Result<(LedgerRow, Arc<dyn Provider>)> {
        let row = match self.ledger.row(id).await {
            Ok(row) => row,
            Err(berth_ledger::LedgerError::Store(berth_store::StoreError::NotFound(..))) => {
                return Err(CliError::not_found(
                    format!("no sandbox `{id}` in the ledger"),
                    "`berth list` shows your sandboxes",
                )
                .into())
            }
            Err(err) => return Err(err.into()),
        };
        if row.state == LedgerState::VerifiedGone {
            return Err(CliError::not_found(
                format!("sandbox `{id}` was destroyed (verified gone)"),
                "create a new one with `berth create`",
            )
            .into());
        }
        let provider = self.provider(&row.provider)?;
        Ok((row, provider))
    }

    /// Must-fire: destroys whatever this invocation created and did not hand over. Reports,
    /// never fails the exit path; says what it removed and what it kept (a mission's sandbox,
    /// held for its resume), never more.
    pub async fn cleanup_after_failure(&self) {
        use berth_ledger::SweepAction;
        match self
            .ledger
            .cleanup_run(&self.registry.bind(&self.provider_config))
            .await
        {
            Ok(report) if !report.complete() => {
                errln!("berth: warning: cleanup incomplete; run `berth ledger sweep`:");
                for entry in &report.entries {
                    errln!("  {}", crate::commands::ledger::sweep_line(entry));
                }
            }
            Ok(report) => {
                let removed = report
                    .entries
                    .iter()
                    .filter(|e| {
                        matches!(e.action, SweepAction::Destroyed | SweepAction::AlreadyGone)
                    })
                    .count();
                if removed > 0 {
                    errln!("berth: cleaned up {removed} sandbox(es)");
                }
                for entry in &report.entries {
                    if let SweepAction::Held { .. } = entry.action {
                        errln!("berth: {}", crate::commands::ledger::sweep_line(entry));
                    }
                }
            }
            Err(err) => {
                errln!(
                    "berth: warning: cleanup failed: {}; run `berth ledger sweep`",
                    crate::human::printable(&err.to_string(), true)
                )
            }
        }
    }
}
