import HTTPServer

/// The console's two static files, compiled in (the binary works from any directory). Both are
/// ours: the Content-Security-Policy allows scripts and styles from this origin only.
enum ConsoleAssets {
    static func response(_ file: String) -> HTTPResponse {
        let (type, body): (String, String)
        switch file {
        case "console.css": (type, body) = ("text/css; charset=utf-8", css)
        case "console.js": (type, body) = ("text/javascript; charset=utf-8", script)
        default:
            return ConsoleRoutes.finish(ConsolePages.message("Not found", "There is no such file."), status: 404)
        }
        return HTTPResponse(status: 200, headers: [("content-type", type), ("cache-control", "no-cache")]
                                + ConsoleSecurity.headers.filter { $0.name != "cache-control" },
                            body: Array(body.utf8))
    }

    /// Enhancements only: every page works without it.
    static let script = #"""
    "use strict";
    document.addEventListener("DOMContentLoaded", function () {
      // Copy buttons: shown only when this script runs.
      document.querySelectorAll("button[data-copy]").forEach(function (button) {
        var status = button.nextElementSibling;
        button.hidden = false;
        button.addEventListener("click", function () {
          var text = button.getAttribute("data-copy");
          function done(ok) {
            if (status) { status.textContent = ok ? "Copied" : "Select the text and copy it"; }
          }
          function fallback() {
            var area = document.createElement("textarea");
            area.value = text;
            area.setAttribute("readonly", "");
            area.className = "offscreen";
            document.body.appendChild(area);
            area.select();
            var ok = false;
            try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
            document.body.removeChild(area);
            done(ok);
          }
          if (navigator.clipboard && window.isSecureContext) {
            navigator.clipboard.writeText(text).then(function () { done(true); }, fallback);
          } else {
            fallback();
          }
        });
      });
      // The revocation's confirmation: its button waits for the exact name (the server checks it too).
      var confirm = document.querySelector("input[data-confirm-name]");
      var submit = document.getElementById("revoke-submit");
      if (confirm && submit) {
        var check = function () { submit.disabled = confirm.value !== confirm.getAttribute("data-confirm-name"); };
        check();
        confirm.addEventListener("input", check);
      }
    });
    """#

    static let css = #"""
    :root { --ink: #1d2330; --muted: #5b6473; --line: #d8dce3; --accent: #3559c7; --danger: #b42318; --bg: #f6f7f9; }
    * { box-sizing: border-box; }
    body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--ink); background: var(--bg); }
    a { color: var(--accent); }
    a:focus-visible, button:focus-visible, input:focus-visible, textarea:focus-visible, select:focus-visible { outline: 3px solid #ffbf47; outline-offset: 1px; }
    header.top { display: flex; flex-wrap: wrap; gap: 8px 24px; align-items: center; padding: 10px 20px; background: #fff; border-bottom: 1px solid var(--line); }
    header.top .brand { font-weight: 700; color: var(--ink); text-decoration: none; }
    header.top nav { display: flex; gap: 16px; flex-wrap: wrap; }
    header.top nav a[aria-current="page"] { font-weight: 700; text-decoration: none; color: var(--ink); border-bottom: 2px solid var(--accent); }
    header.top .who { margin-left: auto; display: flex; gap: 12px; align-items: center; flex-wrap: wrap; color: var(--muted); font-size: 14px; }
    header.top .who form { margin: 0; }
    main { max-width: 1100px; margin: 0 auto; padding: 16px 20px 48px; }
    h1 { font-size: 24px; margin: 8px 0 16px; overflow-wrap: anywhere; }
    h2 { font-size: 18px; margin: 24px 0 8px; }
    h3 { font-size: 16px; margin: 16px 0 8px; }
    .crumbs { margin: 0; font-size: 14px; }
    code { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 13px; overflow-wrap: anywhere; }
    .status { display: inline-block; font-size: 13px; font-weight: 600; padding: 1px 8px; border-radius: 10px; vertical-align: middle; }
    .status.active { background: #e3f4e8; color: #1e6b35; }
    .status.revoked { background: #fbe4e2; color: var(--danger); }
    nav.tabs { display: flex; gap: 4px; flex-wrap: wrap; border-bottom: 1px solid var(--line); margin: 8px 0 16px; }
    nav.tabs a { padding: 8px 12px; text-decoration: none; color: var(--muted); border-bottom: 3px solid transparent; }
    nav.tabs a[aria-current="page"] { color: var(--ink); font-weight: 600; border-bottom-color: var(--accent); }
    .table-wrap { overflow-x: auto; background: #fff; border: 1px solid var(--line); border-radius: 6px; margin: 8px 0 16px; }
    table { border-collapse: collapse; width: 100%; font-size: 14px; }
    caption { text-align: left; padding: 8px 12px; color: var(--muted); font-size: 13px; }
    th, td { text-align: left; padding: 7px 12px; border-top: 1px solid var(--line); vertical-align: top; }
    th { font-weight: 600; background: #fafbfc; white-space: nowrap; }
    /* A token in a table (an action, a client ID) stays whole; a narrow screen scrolls the table. */
    td code { overflow-wrap: normal; white-space: nowrap; }
    dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 8px 20px; background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 16px; margin: 0 0 16px; }
    dl.facts dt { color: var(--muted); }
    dl.facts dd { margin: 0; overflow-wrap: anywhere; }
    dl.facts ul { margin: 0; padding-left: 18px; }
    form { margin: 0; }
    fieldset { border: 1px solid var(--line); border-radius: 6px; background: #fff; padding: 12px 16px; margin: 0 0 16px; min-width: 0; }
    fieldset.inline { background: transparent; }
    legend { font-weight: 600; padding: 0 4px; }
    details { border: 1px solid var(--line); border-radius: 6px; background: #fff; padding: 10px 16px; margin: 12px 0; }
    details[open] > summary { margin-bottom: 12px; }
    summary { cursor: pointer; font-weight: 600; }
    .field { margin: 0 0 14px; max-width: 560px; }
    .field label { display: block; font-weight: 600; margin-bottom: 2px; }
    .field input, .field textarea, .field select { width: 100%; font: inherit; padding: 7px 9px; border: 1px solid #aab1bd; border-radius: 4px; background: #fff; }
    .field input[readonly] { background: #f1f2f4; }
    .field.invalid input, .field.invalid textarea { border-color: var(--danger); }
    .field-error { color: var(--danger); font-weight: 600; margin: 4px 0 0; }
    .hint { color: var(--muted); font-size: 13px; margin: 0 0 4px; }
    .check { display: flex; gap: 8px; align-items: center; margin: 4px 0; }
    .check label { font-weight: 400; }
    .actions { display: flex; gap: 16px; align-items: center; flex-wrap: wrap; margin: 12px 0; }
    button { font: inherit; padding: 7px 14px; border-radius: 4px; border: 1px solid #aab1bd; background: #fff; color: var(--ink); cursor: pointer; }
    button.primary { background: var(--accent); border-color: var(--accent); color: #fff; }
    button.danger { background: var(--danger); border-color: var(--danger); color: #fff; }
    button.link { border: 0; background: none; padding: 0; color: var(--accent); text-decoration: underline; }
    button.link.danger { color: var(--danger); }
    button:disabled { opacity: .5; cursor: not-allowed; }
    button.copy { margin-left: 8px; padding: 2px 10px; font-size: 13px; }
    .copied { margin-left: 8px; color: #1e6b35; font-size: 13px; }
    .notice { padding: 10px 14px; border-radius: 6px; background: #e8eefc; border: 1px solid #c7d3f5; }
    .notice.error { background: #fbe4e2; border-color: #f1b7b1; color: #7a1a12; }
    .warning { padding: 4px 16px; border-left: 4px solid var(--danger); background: #fff; margin: 0 0 16px; }
    .revoked-note { color: var(--danger); font-weight: 600; }
    .empty { color: var(--muted); }
    section.chart, section.budget { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 4px 16px 8px; margin: 0 0 16px; }
    /* Drawn in a 720-unit box: narrower than 600 px, the labels would shrink below 9 px, so the chart scrolls instead. */
    .chart-scroll { overflow-x: auto; }
    svg.chart { width: 100%; min-width: 600px; max-width: 860px; height: auto; display: block; }
    ul.legend { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 4px 16px; font-size: 13px; }
    meter { width: 100%; max-width: 560px; height: 18px; }
    nav.pages { display: flex; gap: 16px; }
    .offscreen { position: absolute; left: -9999px; }
    @media (max-width: 600px) {
      header.top { padding: 8px 12px; }
      header.top .who { margin-left: 0; }
      main { padding: 12px 12px 40px; }
      dl.facts { grid-template-columns: 1fr; gap: 2px; }
      dl.facts dd { margin-bottom: 8px; }
      th, td { padding: 6px 8px; }
    }
    """#
}
