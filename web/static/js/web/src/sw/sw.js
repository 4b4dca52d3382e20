"use strict";
// The page's service worker, served at /sw.js (scope /). It shows a
// notification for each Web Push the server sends while no tab of the
// user is connected (docs/push.md, "Web Push on the page"), and a click on
// one brings the page to that conversation. It has no fetch handler: the
// page's requests never pass through it.
const sw = self;
sw.addEventListener("install", () => void sw.skipWaiting());
sw.addEventListener("activate", (ev) => ev.waitUntil(sw.clients.claim()));
sw.addEventListener("push", (ev) => {
    let p = {};
    try {
        p = (ev.data?.json() ?? {});
    }
    catch {
        // Not JSON: shown as a message of no conversation.
    }
    ev.waitUntil(show(p));
});
/**
 * show: the server's title and body (what push.preview lets through); an
 * E2E conversation's carries neither, so it shows a generic text, as does
 * a payload without them. The tag is the server's collapse id (Topic
 * c<conversation in base 36>): a newer push of the conversation replaces
 * the one shown.
 */
function show(p) {
    const conv = typeof p.conv_id === "string" && /^[0-9]{1,20}$/.test(p.conv_id) ? p.conv_id : "";
    const count = typeof p.count === "number" && p.count > 1 ? p.count : 1;
    let title = "Parley";
    let body = count > 1 ? `${count} new messages` : "New message";
    if (p.e2e === true) {
        body = count > 1 ? `${count} new encrypted messages` : "New encrypted message";
    }
    else {
        if (typeof p.title === "string" && p.title)
            title = p.title;
        if (typeof p.body === "string" && p.body)
            body = p.body;
    }
    const tag = conv ? "c" + BigInt(conv).toString(36) : "parley";
    return sw.registration.showNotification(title, { body, tag, renotify: true, data: { conv } });
}
sw.addEventListener("notificationclick", (ev) => {
    ev.notification.close();
    const conv = typeof ev.notification.data?.conv === "string" ? ev.notification.data.conv : "";
    ev.waitUntil(openPage(conv));
});
/** openPage focuses a tab of the page (telling it which conversation to open), or opens one at /#conv=<id>. */
async function openPage(conv) {
    const home = new URL("/", sw.location.origin);
    const tabs = await sw.clients.matchAll({ type: "window", includeUncontrolled: true });
    const tab = tabs.find((c) => new URL(c.url).pathname === home.pathname);
    if (tab) {
        tab.postMessage({ type: "open", conv });
        await tab.focus();
        return;
    }
    await sw.clients.openWindow(conv ? `${home.href}#conv=${conv}` : home.href);
}
