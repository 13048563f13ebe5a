//! `berth provider new NAME`: arguments in, the written files out. The generator is
//! `berth_scaffold`'s.

use anyhow::Result;
use serde_json::json;

use crate::cli::ProviderCommand;
use crate::errors::code;
use crate::output::emit;

/// Runs `berth provider …`.
pub fn run(json: bool, command: &ProviderCommand) -> Result<i32> {
    let ProviderCommand::New {
        name,
        root,
        berth_source,
    } = command;
    let done = berth_scaffold::new_provider(name, root, berth_source.as_deref())?;
    if json {
        emit(
            "provider new",
            json!({ "provider": name, "written": done.written }),
        );
    } else {
        for path in &done.written {
            outln!("wrote {}", path.display());
        }
        outln!("next: work through {}", done.checklist.display());
    }
    Ok(code::OK)
}
