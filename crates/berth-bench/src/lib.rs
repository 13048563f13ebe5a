//! Berth's benchmarks, as a library: the CLI (`berth bench`, `berth mission bench`) only parses
//! arguments and prints the [`Report`] it gets back.
//!
//! - [`lifecycle`] — `berth bench P…`: create → ready → first exec → destroy → verified gone, per
//!   phase, sequential, burst or staggered, with a reuse probe (ComputeSDK's result shape).
//! - [`raw`] — `berth bench P --raw`: Berth against labelled baselines measured in the same run:
//!   its own mechanism (Berth's overhead), the mechanism other tools use (a comparison), and the
//!   CLI as a whole process (what a user pays).
//! - [`mission`] — `berth mission bench`: the mission control plane's overhead per attempt and
//!   throughput.
//! - [`artifacts`] — `berth bench artifacts`: publishing a 1,000-file, 200 MB bundle against a
//!   raw copy of the same bytes.
//! - [`moving`] — `berth bench move FROM TO`: a move against the same steps without its checks.
//! - [`bridge`] — `berth bench bridge`: the ComputeSDK bridge against the same ComputeSDK
//!   provider driven directly from Node.
//! - [`stats`] — the one percentile helper every figure goes through.
//!
//! Benchmarks reach adapters' bare mechanisms (the docker supervisor socket, `bwrap` run
//! directly, the Engine API), which is why this family — and not the CLI — depends on them.

pub mod artifacts;
pub mod bridge;
pub mod gateway;
pub mod lifecycle;
pub mod mission;
pub mod monitor;
pub mod moving;
pub mod raw;
pub mod serve;
pub mod sessions;
pub mod stats;

use std::path::PathBuf;
use std::sync::Arc;

use berth_contract::{DestroyOutcome, Provider, ProviderError};
use berth_factory::{FactoryError, ProviderConfig, Registry};
use berth_ledger::{Ledger, LedgerError, Tracked};

/// What a benchmark reads: the providers, the ledger every sandbox goes through, and where
/// scratch files go.
#[derive(Debug, Clone)]
pub struct BenchContext {
    /// Providers.
    pub registry: Arc<Registry>,
    /// Their configuration.
    pub provider_config: ProviderConfig,
    /// The ledger (every sandbox a benchmark makes is a row, so a killed run leaves nothing a
    /// sweep cannot find).
    pub ledger: Ledger,
    /// `BERTH_HOME`: scratch directories and missions go under it.
    pub home: PathBuf,
    /// The `berth` executable, for the CLI-as-a-process measurement.
    pub berth: PathBuf,
    /// Told what is being measured as the work goes (a terminal's progress line).
    pub progress: ProgressHook,
}

/// Where a benchmark says how far it is; nothing by default.
#[derive(Clone, Default)]
pub struct ProgressHook(Option<Arc<Say>>);

type Say = dyn Fn(&str) + Send + Sync;

impl ProgressHook {
    /// A hook that calls `say`.
    pub fn new(say: impl Fn(&str) + Send + Sync + 'static) -> ProgressHook {
        ProgressHook(Some(Arc::new(say)))
    }

    pub(crate) fn say(&self, message: &str) {
        if let Some(say) = &self.0 {
            say(message);
        }
    }
}

impl std::fmt::Debug for ProgressHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ProgressHook(on)"
        } else {
            "ProgressHook(off)"
        })
    }
}

impl BenchContext {
    /// Constructs a provider.
    pub fn provider(&self, id: &str) -> Result<Arc<dyn Provider>> {
        Ok(self.registry.construct(id, &self.provider_config)?)
    }

    /// An orchestrator over this context (no crash hook).
    pub fn orchestrator(&self) -> berth_orchestrator::Orchestrator<'_> {
        orchestrator(self)
    }
}

pub(crate) fn orchestrator(ctx: &BenchContext) -> berth_orchestrator::Orchestrator<'_> {
    berth_orchestrator::Orchestrator {
        store: ctx.ledger.store(),
        ledger: &ctx.ledger,
        registry: &ctx.registry,
        config: &ctx.provider_config,
        home: &ctx.home,
        boundary: None,
        lease: Default::default(),
        gateways: Default::default(),
        settled: Default::default(),
        last_stored: Default::default(),
        providers: Default::default(),
    }
}

/// A finished benchmark: the versioned document and its text rendering.
#[derive(Debug, Clone)]
pub struct Report {
    /// The machine-readable result.
    pub json: serde_json::Value,
    /// The same, for a terminal.
    pub text: String,
}

/// A benchmark could not run (a failed measurement never becomes a number).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The request makes no sense (e.g. `--raw` with two providers).
    #[error("{0}")]
    Invalid(String),
    /// A provider call failed.
    #[error("{0}")]
    Provider(#[from] ProviderError),
    /// A provider could not be constructed.
    #[error("{0}")]
    Factory(#[from] FactoryError),
    /// The ledger failed.
    #[error("{0}")]
    Ledger(#[from] LedgerError),
    /// A mission could not be run.
    #[error("{0}")]
    Orchestrator(#[from] berth_orchestrator::OrchestratorError),
    /// Local I/O failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A result could not be serialized.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// A measured operation did not do what it must (the message says which).
    #[error("{0}")]
    Failed(String),
    /// What was being measured when `source` failed.
    #[error("{what}")]
    During {
        /// What was being measured.
        what: String,
        /// Why it failed.
        #[source]
        source: Box<BenchError>,
    },
}

/// The benchmarks' result type.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// Names what was being measured when an error happened.
pub(crate) trait WithContext<T> {
    fn context(self, what: &str) -> Result<T>;
}

impl<T, E: Into<BenchError>> WithContext<T> for std::result::Result<T, E> {
    fn context(self, what: &str) -> Result<T> {
        self.map_err(|e| BenchError::During {
            what: what.to_owned(),
            source: Box::new(e.into()),
        })
    }
}

/// Fails the benchmark with a message.
macro_rules! bail {
    ($($t:tt)*) => {
        return Err($crate::BenchError::Failed(format!($($t)*)))
    };
}
pub(crate) use bail;

/// Creates a sandbox of `provider` through the ledger (origin `bench`).
pub(crate) async fn berth_create_tracked(
    ctx: &BenchContext,
    provider: &Arc<dyn Provider>,
    image: Option<&str>,
) -> Result<berth_ledger::Tracked> {
    let image = image.map(str::to_owned);
    Ok(ctx
        .ledger
        .create_tracked(
            provider.as_ref(),
            "bench",
            None,
            |req| req.image = image,
            |req| {
                let provider = provider.clone();
                async move { provider.create(&req).await }
            },
        )
        .await?)
}

/// Destroys a ledger-tracked sandbox through its row (verified gone, or the row says why not).
pub(crate) async fn destroy_tracked(
    ctx: &BenchContext,
    provider: &dyn Provider,
    tracked: &Tracked,
) -> Result<DestroyOutcome> {
    let row = ctx.ledger.row(&tracked.berth_id).await?;
    Ok(ctx.ledger.destroy_row(provider, &row).await?)
}
