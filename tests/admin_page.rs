//! The admin page of `examples/admin.rs` as a browser sees it: a headless Chromium loads the page
//! while the failing upstream is ejected, and the DOM it parsed must hold the self-refresh and one
//! table row per endpoint with its status.
//!
//! Skipped (it says so on stderr and passes) when no headless Chromium is on the machine, unless
//! `ADMIN_BROWSER_REQUIRED` is set (CI sets it): then it fails. On
//! Debian `apt-get install chromium-headless-shell` (or `chromium`) brings one. `ADMIN_BROWSER`
//! names another binary.

#[allow(dead_code)] // Only the demo's set-up is used here, not its `main` or its checks.
#[path = "../examples/admin.rs"]
mod admin;

use std::path::PathBuf;
use std::time::Duration;

/// How long the browser may take to load and dump the page (it takes well under a second).
const BROWSER_PATIENCE: Duration = Duration::from_secs(60);

/// The first headless-capable Chromium on `PATH`, or the one `ADMIN_BROWSER` names.
fn browser() -> Option<PathBuf> {
    if let Some(named) = std::env::var_os("ADMIN_BROWSER") {
        return Some(named.into());
    }
    let path = std::env::var_os("PATH")?;
    [
        "chromium-headless-shell",
        "chromium",
        "chromium-browser",
        "google-chrome",
    ]
    .into_iter()
    .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
    .find(|candidate| candidate.is_file())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_headless_browser_shows_the_ejected_endpoint() {
    let Some(browser) = browser() else {
        assert!(
            std::env::var_os("ADMIN_BROWSER_REQUIRED").is_none(),
            "ADMIN_BROWSER_REQUIRED is set and no headless Chromium is on PATH"
        );
        eprintln!(
            "SKIPPED: no headless Chromium on PATH (chromium-headless-shell, chromium, \
             chromium-browser, google-chrome); `apt-get install chromium-headless-shell` to run \
             this test"
        );
        return;
    };
    let demo = admin::Demo::start().await.expect("the demo starts");
    demo.eject().await.expect("the failing upstream is ejected");
    let url = format!("http://{}/", demo.admin);

    // `--dump-dom` prints the DOM once the page has loaded. Not `--virtual-time-budget`: with it,
    // Chromium fast-forwards through the page's own refresh and reloads it in a tight loop.
    // `--no-sandbox`: Chromium's sandbox refuses to run as root, as CI does.
    let output = tokio::time::timeout(
        BROWSER_PATIENCE,
        tokio::process::Command::new(&browser)
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
            .arg(&url)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{} took over {BROWSER_PATIENCE:?}", browser.display()))
    .unwrap_or_else(|e| panic!("{} did not run: {e}", browser.display()));
    let dom = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{}: {}\n{stderr}",
        output.status,
        browser.display()
    );

    // The DOM as the browser serializes it: the page parsed into a head and a table.
    assert!(
        dom.contains(r#"<meta http-equiv="refresh" content="2">"#),
        "no refresh in the parsed page:\n{dom}\n{stderr}"
    );
    let rows: Vec<&str> = dom.split("<tr").skip(1).collect();
    assert_eq!(
        rows.len(),
        1 + demo.upstreams.len(),
        "a header row and one per endpoint:\n{dom}"
    );
    for (i, upstream) in demo.upstreams.iter().enumerate() {
        let key = format!("<code>{:?}</code>", upstream.addr);
        let row = rows
            .iter()
            .find(|row| row.contains(&key))
            .unwrap_or_else(|| panic!("no row for {key}:\n{dom}"));
        let (class, status) = if i == demo.failing {
            ("out", "Ejected")
        } else {
            ("in", "Available")
        };
        assert!(
            row.starts_with(&format!(r#" class="{class}">"#))
                && row.contains(&format!(r#"<td class="status">{status}</td>"#)),
            "{} should be {status}: <tr{row}",
            upstream.name
        );
    }
}
