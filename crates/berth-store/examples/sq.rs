use std::time::{Duration, Instant};
fn main() {
    let p = std::path::PathBuf::from(std::env::args().nth(1).unwrap());
    let mut t = [Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..300 {
        let s = Instant::now();
        let conn = rusqlite::Connection::open_with_flags(
            &p,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .unwrap();
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        let a = s.elapsed();
        conn.pragma_update(None, "foreign_keys", "ON").unwrap();
        conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
        let b = s.elapsed();
        let v: Vec<(i64, Vec<u8>)> = conn
            .prepare(
                "SELECT version, checksum FROM _sqlx_migrations WHERE success = 1 ORDER BY version",
            )
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(!v.is_empty());
        let c = s.elapsed();
        let n: i64 = conn
            .query_row("SELECT count(*) FROM ledger", [], |r| r.get(0))
            .unwrap();
        let _ = n;
        let d = s.elapsed();
        drop(conn);
        let e = s.elapsed();
        for (i, x) in [a, b - a, c - b, d - c, e - d].into_iter().enumerate() {
            t[i].push(x.as_micros());
        }
    }
    for (n, v) in [
        "open",
        "pragmas(schema parse)",
        "migrations check",
        "ledger read",
        "close",
    ]
    .iter()
    .zip(t.iter_mut())
    {
        v.sort();
        println!("{n}: median {} us", v[v.len() / 2]);
    }
}
