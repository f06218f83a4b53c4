//! `zcfs-bench samehost --quick` writes samehost.json: a list of rows for every path,
//! op and size, with sane values (no timing assertions: only that each was measured).

use std::process::Command;

#[test]
fn samehost_quick_writes_rows_for_every_path() {
    let out = std::env::temp_dir().join(format!("zcfs-bench-samehost-test-{}", std::process::id()));
    let st = Command::new(env!("CARGO_BIN_EXE_zcfs-bench"))
        .args(["samehost", "--quick", "--seconds", "0.05", "--out"])
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success(), "zcfs-bench samehost --quick failed");
    let json = std::fs::read_to_string(out.join("samehost.json")).unwrap();
    let md = std::fs::read_to_string(out.join("samehost.md")).unwrap();
    let _ = std::fs::remove_dir_all(&out);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    // The FUSE rows need the zcfs binary beside this one and /dev/fuse: present when
    // the workspace is built, else named as skipped in samehost.md.
    let fuse = rows.iter().any(|r| r["path"] == "fuse-local");
    assert!(fuse || md.contains("skipped fuse-local"), "{md}");
    let mut paths = vec!["direct", "shared", "in-process"];
    if fuse {
        paths.push("fuse-local");
    }
    for path in paths {
        for op in ["read", "write"] {
            for size in [4096u64, 1 << 20] {
                let r = rows
                    .iter()
                    .find(|r| r["path"] == path && r["op"] == op && r["size"] == size)
                    .unwrap_or_else(|| panic!("no row {path} {op} {size}: {json}"));
                assert!(r["ops"].as_u64().unwrap() >= 1, "{r}");
                let p50 = r["p50_us"].as_f64().unwrap();
                assert!(p50 > 0.0 && p50 < 10e6, "{r}");
                assert!(r["p99_us"].as_f64().unwrap() >= p50, "{r}");
                assert!(r["mb_s"].as_f64().unwrap() > 0.0, "{r}");
                let copies = &r["copies_per_byte"];
                match path {
                    // From the service's counters.
                    "direct" => assert_eq!(copies.as_f64(), Some(0.0), "{r}"),
                    "shared" => assert_eq!(copies.as_f64(), Some(1.0), "{r}"),
                    "in-process" => assert_eq!(copies.as_f64(), Some(1.0), "{r}"),
                    _ => assert!(copies.is_null() && r["note"].is_string(), "{r}"),
                }
            }
        }
    }
    assert!(md.contains("| read | 4 KiB | direct |"), "{md}");
}
