//! The interactive-access clause: a terminal that is a real terminal (a tty, its size,
//! Ctrl-C delivered as SIGINT inside the sandbox, the command's own exit code), and a port
//! connection that fails as `unavailable` when nothing listens.

use std::collections::BTreeMap;

use berth_contract::PtyRequest;
use berth_supervisor::pty::{Client, Screen};
use berth_supervisor::Exit;

use super::*;

/// Printed by the session's command once its SIGINT trap is set.
const READY: &str = "berth-ready";

pub(super) async fn access(s: &Subject) -> Outcome {
    on_sandbox(s, |id| async move {
        let access = s.provider.require_access().map_err(|e| fail("access", e))?;
        let script = format!(
            "trap 'echo berth-got-int; exit 9' INT; test -t 0 && echo berth-on-a-terminal; \
             stty size; echo {READY}; while :; do sleep 0.1; done"
        );
        let request = PtyRequest {
            argv: vec!["/bin/sh".into(), "-c".into(), script],
            env: BTreeMap::from([("TERM".to_owned(), "dumb".to_owned())]),
            cols: 91,
            rows: 17,
        };
        let stream = access
            .open_pty(&id, &request)
            .await
            .map_err(|e| fail("open_pty", e))?;
        let (screen, exit) = tokio::task::spawn_blocking(move || -> Step<(String, Exit)> {
            stream
                .set_read_timeout(Some(Duration::from_secs(20)))
                .map_err(|e| e.to_string())?;
            let client = Client::new(stream);
            let mut screen = String::new();
            let mut interrupted = false;
            loop {
                match client
                    .next()
                    .map_err(|e| format!("read the terminal (screen so far {screen:?}): {e}"))?
                {
                    Screen::Output(bytes) => {
                        screen.push_str(&String::from_utf8_lossy(&bytes));
                        if !interrupted && screen.contains(READY) {
                            // Ctrl-C, typed.
                            client.send(&[3]).map_err(|e| format!("type Ctrl-C: {e}"))?;
                            interrupted = true;
                        }
                    }
                    Screen::Ended(exit) => return Ok((screen, exit)),
                }
            }
        })
        .await
        .map_err(|e| format!("the terminal reader panicked: {e}"))??;
        check!(
            screen.contains("berth-on-a-terminal"),
            "the session's standard input is not a terminal: {screen:?}"
        );
        check!(
            screen.contains("17 91"),
            "`stty size` did not report the requested 17 rows × 91 columns: {screen:?}"
        );
        check!(
            screen.contains("berth-got-int"),
            "Ctrl-C did not reach the sandbox's foreground process as SIGINT: {screen:?}"
        );
        check!(
            exit == Exit::Exited { code: 9 },
            "the session ended {exit:?}, not with its command's own exit code 9"
        );
        // Port 1 (tcpmux) has no listener anywhere we run.
        match access.connect_port(&id, 1).await {
            Err(e) if e.kind() == ErrorKind::Unavailable => {}
            Err(e) => {
                return Err(format!(
                    "connecting to a port nothing listens on failed as {}, not unavailable: {e}",
                    e.kind()
                ))
            }
            Ok(_) => return Err("connecting to port 1, where nothing listens, succeeded".into()),
        }
        Ok(vec![
            "terminal: stdin a terminal, 91×17, Ctrl-C → SIGINT in the sandbox, exit 9 passed \
             through; a closed port → unavailable"
                .into(),
        ])
    })
    .await
}
