//! `dlock compare`: the report over two spawned backends has every case, scenario and figure,
//! its charts draw the JSON's numbers, its Markdown says what its JSON says, and its HTML stands
//! alone; a broken backend run through the library shows as failed.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Arc;

use conformance_tests::mutants::{Defect, target};
use conformance_tests::{Kind, registry};
use dlock_cli::compare::{self, CompareOptions, Source, render};
use serde_json::Value;

mod common;

use common::{dlock, eventually};

fn names(kind: Kind) -> Vec<&'static str> {
    registry()
        .iter()
        .filter(|c| c.kind == kind)
        .map(|c| c.name)
        .collect()
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The tags of an HTML page, checked to nest: every element but the void ones closes, in
/// order. Returns the names of the elements opened, in order.
fn parse_html(html: &str) -> Vec<String> {
    const VOID: &[&str] = &["meta", "br", "img", "hr", "input", "link"];
    let mut open: Vec<String> = Vec::new();
    let mut seen = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find('<') {
        rest = &rest[at + 1..];
        let end = rest.find('>').expect("a tag that never ends");
        let tag = &rest[..end];
        rest = &rest[end + 1..];
        if tag.starts_with('!') {
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            let top = open
                .pop()
                .unwrap_or_else(|| panic!("</{name}> closes nothing"));
            assert_eq!(top, name.trim(), "</{name}> closes <{top}>");
            continue;
        }
        let name: String = tag
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        assert!(!name.is_empty(), "a tag without a name: <{tag}>");
        seen.push(name.clone());
        if !tag.ends_with('/') && !VOID.contains(&name.as_str()) {
            open.push(name);
        }
    }
    assert!(open.is_empty(), "never closed: {open:?}");
    seen
}

/// The `data-*` attributes of every chart mark of one `<svg>`, by backend.
fn marks(svg: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for part in svg.split("<g class=\"mark\"").skip(1) {
        let head = &part[..part.find('>').expect("mark tag ends")];
        let mut attrs = BTreeMap::new();
        for piece in head.split(" data-").skip(1) {
            let (key, value) = piece.split_once("=\"").expect("attribute");
            let value = &value[..value.find('"').expect("quoted")];
            attrs.insert(key.to_owned(), value.to_owned());
        }
        let backend = attrs.remove("backend").expect("data-backend");
        assert!(
            out.insert(backend.clone(), attrs).is_none(),
            "two marks for {backend} in one chart"
        );
    }
    out
}

fn same(drawn: &str, json: &Value, what: &str) {
    let drawn: f64 = drawn
        .parse()
        .unwrap_or_else(|_| panic!("{what}: drawn value {drawn:?} is no number"));
    // The chart prints the shortest text that reads back as the same f64; serde_json's reader
    // may land one unit in the last place away from it.
    let want = num(json);
    assert!(
        (drawn - want).abs() <= 1e-12 * want.abs().max(1.0),
        "{what}: the chart draws {drawn}, report.json has {want}"
    );
}

#[test]
fn compare_two_spawned_backends_writes_a_complete_consistent_report() {
    let dir = tempfile::tempdir().unwrap();
    let out = dlock()
        .args(["compare", "--spawn", "sqlite,redis", "--quick", "--out"])
        .arg(dir.path())
        .output()
        .expect("run dlock compare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("report.json")).expect("report.json"),
    )
    .expect("report.json parses");
    let backends = json["backends"].as_array().expect("backends");
    let labels: Vec<&str> = backends
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["sqlite", "redis"], "{stderr}");
    // The exit code says what the report says.
    let problems = backends.iter().any(|b| {
        b["cases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["status"] == "failed")
            || b["scenarios"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["verdict"] == "violation")
    });
    assert_eq!(
        out.status.code(),
        Some(if problems { 1 } else { 0 }),
        "{stdout}\n{stderr}"
    );

    for b in backends {
        let name = b["name"].as_str().unwrap();
        assert!(b["unavailable"].is_null(), "{name}: {}", b["unavailable"]);
        assert_eq!(b["source"], "spawned");
        for key in ["fencing", "expiry", "fairness", "wake_up"] {
            assert!(b["sheet"][key].is_string(), "{name}: sheet lacks {key}");
        }
        let cases: Vec<&str> = b["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["case"].as_str().unwrap())
            .collect();
        assert_eq!(cases, names(Kind::Case), "{name}: every case, in order");
        let scenarios = b["scenarios"].as_array().unwrap();
        let listed: Vec<&str> = scenarios
            .iter()
            .map(|s| s["scenario"].as_str().unwrap())
            .collect();
        assert_eq!(listed, names(Kind::Fault), "{name}: every scenario");
        for s in scenarios {
            let verdict = s["verdict"].as_str().unwrap();
            assert!(
                ["safe", "documented_unsafe", "violation", "not_applicable"].contains(&verdict),
                "{name}: a spawned backend's scenario is {verdict}"
            );
        }
        // A spawned backend runs the scenarios it can: both have at least the client ones.
        assert!(
            scenarios.iter().filter(|s| s["verdict"] == "safe").count() >= 3,
            "{name}: {scenarios:?}"
        );
        let u = &b["bench"]["uncontended"];
        assert!(num(&u["pairs_per_sec"]) > 0.0, "{name}: {u}");
        assert!(num(&u["latency"]["p50_us"]) > 0.0);
        assert!(num(&u["latency"]["p99_us"]) >= num(&u["latency"]["p50_us"]));
        let floor = if u["fenced_floor"].is_null() {
            &u["floor"]
        } else {
            &u["fenced_floor"]
        };
        assert!(num(&floor["pairs_per_sec"]) > 0.0, "{name}: no floor: {u}");
        let c = &b["bench"]["contended"];
        assert!(num(&c["acquisitions_per_sec"]) > 0.0, "{name}: {c}");
        assert!(num(&c["limit_per_sec"]) > 0.0);
        assert_eq!(c["per_client"].as_array().unwrap().len(), 8);
        for key in ["handoff", "wait"] {
            assert!(num(&c[key]["p99_us"]) > 0.0, "{name}: {key}");
        }
        // Both have semaphores: how full a busy one of 4 permits stays.
        let s = &b["bench"]["semaphore"];
        assert_eq!(s["permits"], 4, "{name}: {s}");
        let holders = num(&s["mean_holders"]);
        assert!(holders > 0.0 && holders <= 4.0, "{name}: {holders}");
        assert_eq!(s["violations"], 0, "{name}: more than 4 holders at once");
    }

    // The page stands alone and nests; its charts are inline, one mark per backend, drawing
    // report.json's numbers.
    let html = std::fs::read_to_string(dir.path().join("report.html")).expect("report.html");
    let tags = parse_html(&html);
    for external in [
        "<script", "<link", "<img", "src=", "href=", "url(", "@import",
    ] {
        assert!(!html.contains(external), "report.html has {external}");
    }
    let without_ns = html.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    assert!(
        !without_ns.contains("http://") && !without_ns.contains("https://"),
        "report.html names an address"
    );
    assert_eq!(tags.iter().filter(|t| *t == "svg").count(), 4);
    let svgs: Vec<&str> = html
        .split("<svg")
        .skip(1)
        .map(|s| &s[..s.find("</svg>").unwrap()])
        .collect();
    let by_name = |n: &str| backends.iter().find(|b| b["name"] == n).unwrap();
    let charts: Vec<BTreeMap<_, _>> = svgs.iter().map(|s| marks(s)).collect();
    for chart in &charts {
        assert_eq!(
            chart.keys().map(String::as_str).collect::<Vec<_>>(),
            ["redis", "sqlite"],
            "one mark per backend"
        );
    }
    for (backend, attrs) in &charts[0] {
        let u = &by_name(backend)["bench"]["uncontended"];
        same(&attrs["value"], &u["pairs_per_sec"], "throughput");
        let floor = if u["fenced_floor"].is_null() {
            &u["floor"]
        } else {
            &u["fenced_floor"]
        };
        same(&attrs["floor"], &floor["pairs_per_sec"], "floor");
    }
    for (backend, attrs) in &charts[1] {
        let l = &by_name(backend)["bench"]["uncontended"]["latency"];
        same(&attrs["p50"], &l["p50_us"], "p50");
        same(&attrs["p99"], &l["p99_us"], "p99");
        same(&attrs["p999"], &l["p999_us"], "p99.9");
    }
    for (backend, attrs) in &charts[2] {
        let c = &by_name(backend)["bench"]["contended"];
        same(&attrs["value"], &c["acquisitions_per_sec"], "contended");
        same(&attrs["limit"], &c["limit_per_sec"], "limit");
    }
    for (backend, attrs) in &charts[3] {
        let c = &by_name(backend)["bench"]["contended"];
        same(&attrs["min"], &c["per_client_min"], "min");
        same(&attrs["max"], &c["per_client_max"], "max");
        same(&attrs["fairness"], &c["fairness"], "fairness");
    }

    // report.md: each grid row and benchmark cell is the JSON's.
    let md = std::fs::read_to_string(dir.path().join("report.md")).expect("report.md");
    let row = |first: &str| -> Vec<String> {
        let line = md
            .lines()
            .find(|l| l.starts_with(&format!("| {first} |")))
            .unwrap_or_else(|| panic!("report.md has no row {first}"));
        line.trim_matches('|')
            .split(" | ")
            .map(|c| c.trim().to_owned())
            .collect()
    };
    for case in names(Kind::Case) {
        let cells = row(case);
        for (i, b) in backends.iter().enumerate() {
            let status = b["cases"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["case"] == case)
                .unwrap()["status"]
                .as_str()
                .unwrap();
            let want = match status {
                "passed" => "pass",
                "failed" => "FAIL",
                _ => "n/a",
            };
            assert_eq!(cells[i + 1], want, "report.md row {case}");
        }
    }
    for scenario in names(Kind::Fault) {
        let cells = row(scenario);
        for (i, b) in backends.iter().enumerate() {
            let verdict = b["scenarios"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["scenario"] == scenario)
                .unwrap()["verdict"]
                .as_str()
                .unwrap();
            let want = match verdict {
                "safe" => "safe",
                "documented_unsafe" => "documented unsafe",
                "violation" => "VIOLATION",
                _ => "n/a",
            };
            assert_eq!(cells[i + 1], want, "report.md row {scenario}");
        }
    }
    for b in backends {
        let cells = row(b["name"].as_str().unwrap());
        let u = &b["bench"]["uncontended"];
        let c = &b["bench"]["contended"];
        assert_eq!(cells[1], format!("{:.0}", num(&u["pairs_per_sec"])));
        assert_eq!(cells[6], format!("{:.0}", num(&c["acquisitions_per_sec"])));
        assert_eq!(
            cells[11],
            format!("{}/{}", c["per_client_min"], c["per_client_max"])
        );
        let s = &b["bench"]["semaphore"];
        assert_eq!(cells[12], format!("{:.2}", num(&s["mean_holders"])));
    }
    // The terminal table names both and says where the files went.
    for file in ["report.json", "report.md", "report.html"] {
        assert!(stdout.contains(file), "{stdout}");
        common::assert_no_kit_password(&std::fs::read_to_string(dir.path().join(file)).unwrap());
    }
    common::assert_no_kit_password(&format!("{stdout}{stderr}"));
}

#[test]
fn a_broken_backend_run_through_the_library_fails_the_report() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut options = CompareOptions::new(vec![Source::Target(target(Defect::ConstantToken))]);
    options.case_timeout = std::time::Duration::from_secs(60);
    let report = rt.block_on(compare::run(&options, Arc::new(|_: &compare::Status| {})));
    assert!(!report.ok(), "a backend with one constant token passed");
    // The outcome `dlock compare` turns into exit code 1.
    assert_eq!(report.outcome(), compare::RunOutcome::Problems);
    let b = &report.backends[0];
    let failed: Vec<&str> = b
        .cases
        .iter()
        .filter(|c| matches!(c.outcome, conformance_tests::Outcome::Failed { .. }))
        .map(|c| c.case.as_str())
        .collect();
    assert!(failed.contains(&"fencing_tokens_increase"), "{failed:?}");
    // Its fault scenarios need servers the library target cannot start; its benchmark needs a
    // URL: both say so rather than vanish.
    assert!(
        b.scenarios
            .iter()
            .all(|s| s.verdict == compare::Verdict::NeedsSpawn),
        "{:?}",
        b.scenarios
    );
    assert!(b.bench.error.is_some());
    let md = render::markdown(&report);
    assert!(md.contains("| fencing_tokens_increase | FAIL |"), "{md}");
    assert!(md.contains("## Problems"), "{md}");
    let dir = tempfile::tempdir().unwrap();
    render::write(&report, dir.path()).unwrap();
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert!(html.contains("problems found"), "the page's verdict");
}

/// The processes whose parent is `pid`, with their command names, from /proc.
fn children(pid: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`: the name may hold spaces, so split after its `)`.
        let Some((head, tail)) = stat.rsplit_once(") ") else {
            continue;
        };
        let ppid = tail.split(' ').nth(1).and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            let comm = head.split_once(" (").map_or("", |(_, c)| c).to_owned();
            out.push((child, comm));
        }
    }
    out
}

#[test]
fn ctrl_c_stops_the_servers_it_started_and_writes_no_report() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = dlock()
        .args(["compare", "--spawn", "redis", "--out"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("dlock compare starts");
    let pid = child.id();
    let servers: Vec<u32> = eventually("the spawned redis-server", || {
        let found: Vec<u32> = children(pid)
            .into_iter()
            .filter(|(_, comm)| comm == "redis-server")
            .map(|(p, _)| p)
            .collect();
        if found.is_empty() {
            Err(format!("children {:?}", children(pid)))
        } else {
            Ok(found)
        }
    });
    let sent = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let status = eventually("dlock compare to stop on SIGINT", || {
        child
            .try_wait()
            .unwrap()
            .ok_or_else(|| "running".to_owned())
    });
    assert_eq!(status.code(), Some(130));
    for server in servers {
        // A zombie waits only for init to reap it: it no longer runs.
        eventually(&format!("redis-server {server} to be gone"), || {
            match conformance_tests::kit::is_alive(server) {
                true => Err("still runs".to_owned()),
                false => Ok(()),
            }
        });
    }
    assert!(
        !dir.path().join("report.json").exists(),
        "an interrupted run wrote a report"
    );
}

#[test]
fn a_bad_url_or_backend_name_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    for (args, code) in [
        (vec!["--url", "nope://host"], 78),
        (vec!["--url", ""], 64),
        (vec!["--spawn", "redis,bogus"], 64),
        (vec!["--spawn", "sqlite", "--jobs", "0"], 64),
    ] {
        let o = dlock()
            .arg("compare")
            .args(&args)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(code), "{args:?}: {o:?}");
        assert!(!out.exists(), "{args:?} created the report directory");
    }
}
