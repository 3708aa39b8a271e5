// masd console: follows the event feed live and asks before a drop. The pages read
// without it. Text from the feed is set with textContent only, never as HTML.
"use strict";

function cell(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  node.textContent = text;
  return node;
}

function kindClass(kind) {
  return "kind-" + kind.replace(/[^A-Za-z0-9]/g, "-");
}

function timelineRow(row) {
  const li = cell("li", "entry fresh " + kindClass(row.kind), "");
  li.dataset.seq = row.seq;
  li.append(cell("span", "seq", "#" + row.seq));
  const at = cell("time", "", row.at);
  at.setAttribute("datetime", row.at);
  li.append(at, cell("span", "kind", row.kind), cell("span", "what", row.what));
  if (row.state) {
    li.append(cell("span", "delivery state-" + row.state, row.state), cell("span", "more", row.more));
  }
  return li;
}

function feedRow(event) {
  const row = event.row;
  const li = cell("li", "fresh " + kindClass(row.kind), "");
  const link = cell("a", "", event.case.address);
  link.href = "/console/cases/" + encodeURIComponent(event.case.key);
  li.append(cell("time", "", row.at), cell("span", "kind", row.kind), link, cell("span", "what", row.what));
  return li;
}

function follow(list) {
  const states = document.querySelectorAll(".live-state");
  const say = (text) => states.forEach((node) => { node.textContent = text; });
  const source = new EventSource(list.dataset.feed);
  source.onopen = () => say("live");
  source.onerror = () => say(source.readyState === EventSource.CLOSED ? "stopped" : "reconnecting…");
  source.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (list.classList.contains("timeline")) {
      if (list.querySelector('[data-seq="' + CSS.escape(event.row.seq) + '"]')) return;
      list.append(timelineRow(event.row));
      const empty = document.getElementById("timeline-empty");
      if (empty) empty.remove();
    } else {
      const events = list.querySelector("ol.events");
      events.prepend(feedRow(event));
      while (events.children.length > 50) events.lastChild.remove();
    }
  };
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-feed]").forEach(follow);
  document.querySelectorAll("form[data-confirm]").forEach((form) => {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  });
});
