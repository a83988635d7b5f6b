"""`mnemo graph USER --html FILE`: one self-contained, offline HTML page of a user's memory.

The page holds its data as JSON and ~150 lines of vanilla JavaScript that draw it as inline SVG (no
library, no CDN, no network): nodes along the time axis (x = position in time order), one lane per
cluster (y), coloured by cluster and shaped by kind (circle = fragment, diamond = insight); the
temporal chain as a line through consecutive nodes; the phases of the cognitive memory as shaded
bands behind the nodes they cover. Hover shows a node's or a phase's text, date and sources; a click
pins it in the side panel; the mouse wheel zooms and dragging pans. Every drawn node is an SVG element
with class `node`, and the svg's `data-nodes` attribute counts them once drawing finished (the test
reads both from the rendered DOM).
"""
from __future__ import annotations

import html
import json
from typing import Any

import polars as pl

from memory.read import load_graph, read_profile
from memory.schemas import MEMORY_TABLES
from memory.store import Store

LANES = 10


def graph_data(store: Store, user: str) -> dict[str, Any]:
    """Nodes, temporal edges, phases and profile of one user, ready for the page."""
    nodes, edges = load_graph(store, user)
    texts: dict[str, dict[str, Any]] = {}
    for kind in ("fragment", "insight"):
        df = pl.from_arrow(store.read(MEMORY_TABLES[kind], user, columns=["id", "text", "date", "source_ids"]))
        assert isinstance(df, pl.DataFrame)
        for r in df.iter_rows(named=True):
            texts[r["id"]] = {"text": r["text"] or "", "date": r["date"] or "", "sources": list(r["source_ids"] or [])}
    clusters: dict[str, int] = {}
    out_nodes = []
    pos: dict[str, int] = {}
    for i, r in enumerate(nodes.iter_rows(named=True) if nodes.height else []):
        c = clusters.setdefault(r["cluster_id"], len(clusters))
        t = texts.get(r["node_id"], {"text": "", "date": "", "sources": []})
        pos[r["node_id"]] = i
        out_nodes.append({"i": i, "id": r["node_id"], "kind": r["kind"], "cluster": c, "lane": c % LANES,
                          "session": r["session_ts"].strftime("%Y-%m-%d"), **t})
    out_edges = [[pos[s], pos[d]] for s, d in (edges.select(["src_id", "dst_id"]).iter_rows() if edges.height else [])
                 if s in pos and d in pos]
    profile, phases = read_profile(store, user)
    out_phases = []
    for p in phases:
        members = [pos[m] for m in p["member_ids"] if m in pos]
        if members:
            out_phases.append({"from": min(members), "to": max(members), "date": p["date"], "text": p["content"],
                               "sources": list(p["source_ids"] or [])})
    out_phases.sort(key=lambda p: (p["from"], p["to"]))
    return {"user": user, "nodes": out_nodes, "edges": out_edges, "phases": out_phases,
            "clusters": len(clusters), "lanes": min(LANES, max(1, len(clusters))),
            "profile": profile["content"] if profile else "", "profile_date": profile["date"] if profile else ""}


def render(data: dict[str, Any]) -> str:
    """The page for `graph_data(...)`: HTML + inline CSS + inline JS + the data as JSON."""
    payload = json.dumps(data, ensure_ascii=False).replace("</", "<\\/").replace("<!--", "<\\!--")
    title = html.escape(f"mnemo memory graph: {data['user']}")
    return _PAGE.replace("__TITLE__", title).replace("__DATA__", payload)


def write_html(store: Store, user: str, path: str) -> dict[str, int]:
    """Write the page of one user to `path`; returns what it drew."""
    data = graph_data(store, user)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render(data))
    return {"nodes": len(data["nodes"]), "edges": len(data["edges"]), "phases": len(data["phases"]),
            "clusters": data["clusters"]}


_PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{margin:0;font:13px/1.4 system-ui,sans-serif;display:flex;height:100vh;color:#222}
#main{flex:1;display:flex;flex-direction:column;min-width:0}
header{padding:8px 12px;border-bottom:1px solid #ddd}
#wrap{flex:1;overflow:hidden;cursor:grab;background:#fafafa}
aside{width:340px;border-left:1px solid #ddd;padding:10px;overflow:auto;white-space:pre-wrap}
#tip{position:fixed;pointer-events:none;background:#fff;border:1px solid #999;padding:6px;max-width:360px;
display:none;box-shadow:0 2px 6px #0003;white-space:pre-wrap}
.node{stroke:#333;stroke-width:.6}.node:hover,.node.sel{stroke:#000;stroke-width:2}
.band{fill:#4a7bd0;opacity:.07}.band.odd{opacity:.14}.band:hover{opacity:.3}
.chain{fill:none;stroke:#888;stroke-width:.8}.legend{font-size:12px}
</style></head><body>
<div id="main"><header><b id="ttl"></b> <span id="stats"></span><br>
<span class="legend">● fragment ◆ insight · colour = cluster · grey line = temporal chain · bands = phases ·
wheel: zoom, drag: pan, click: pin</span></header>
<div id="wrap"><svg id="g" xmlns="http://www.w3.org/2000/svg" width="100%" height="100%"></svg></div></div>
<aside id="side"></aside><div id="tip"></div>
<script type="application/json" id="data">__DATA__</script>
<script>
(function(){
"use strict";
var D=JSON.parse(document.getElementById("data").textContent);
var NS="http://www.w3.org/2000/svg",svg=document.getElementById("g"),tip=document.getElementById("tip"),
side=document.getElementById("side");
var DX=14,LANE=46,TOP=30,LEFT=30;
function el(n,a,p){var e=document.createElementNS(NS,n);for(var k in a)e.setAttribute(k,a[k]);(p||svg).appendChild(e);return e;}
function color(c){return "hsl("+((c*137.508)%360).toFixed(1)+",65%,55%)";}
function x(i){return LEFT+i*DX;}
function y(n){var j=((n.i*7919)%11-5)*2.2;return TOP+n.lane*LANE+LANE/2+j;}
function describe(o){var s=o.kind?(o.kind+" · "+o.date+" (session "+o.session+")"):("phase · "+o.date);
return s+"\n\n"+o.text+"\n\nsources: "+(o.sources.length?o.sources.join(", "):"-");}
document.getElementById("ttl").textContent="Memory of "+D.user;
var W=LEFT*2+Math.max(1,D.nodes.length)*DX,H=TOP*2+D.lanes*LANE;
var root=el("g",{id:"root"});
D.phases.forEach(function(p,k){
  var b=el("rect",{"class":"band"+(k%2?" odd":""),x:x(p.from)-DX/2,y:TOP-20,width:(p.to-p.from+1)*DX,
    height:D.lanes*LANE+30},root);
  b.addEventListener("mousemove",function(ev){show(ev,p);});b.addEventListener("mouseleave",hide);
  b.addEventListener("click",function(){pin(p,null);});
  var t=el("text",{x:x(p.from)-DX/2+2,y:TOP-8,"font-size":"10",fill:"#345"},root);t.textContent="phase "+(k+1);
});
if(D.nodes.length>1){var pts=D.edges.map(function(e){var a=D.nodes[e[0]],b=D.nodes[e[1]];
  return "M"+x(a.i)+","+y(a)+"L"+x(b.i)+","+y(b);}).join("");el("path",{"class":"chain",d:pts},root);}
var drawn=0;
D.nodes.forEach(function(n){
  var e;
  if(n.kind==="insight"){var cx=x(n.i),cy=y(n),r=6;
    e=el("polygon",{points:cx+","+(cy-r)+" "+(cx+r)+","+cy+" "+cx+","+(cy+r)+" "+(cx-r)+","+cy},root);}
  else{e=el("circle",{cx:x(n.i),cy:y(n),r:4.5},root);}
  e.setAttribute("class","node "+n.kind);e.setAttribute("fill",color(n.cluster));
  e.setAttribute("data-id",n.id);e.setAttribute("data-cluster",n.cluster);
  e.addEventListener("mousemove",function(ev){show(ev,n);});e.addEventListener("mouseleave",hide);
  e.addEventListener("click",function(ev){ev.stopPropagation();pin(n,e);});
  drawn++;
});
function show(ev,o){tip.textContent=describe(o);tip.style.display="block";
  tip.style.left=Math.min(ev.clientX+12,innerWidth-380)+"px";tip.style.top=(ev.clientY+12)+"px";}
function hide(){tip.style.display="none";}
var selected=null;
function pin(o,e){if(selected)selected.classList.remove("sel");selected=e;if(e)e.classList.add("sel");
  side.textContent=describe(o);}
side.textContent=(D.profile?("Profile ("+D.profile_date+")\n\n"+D.profile):"No profile yet.")+"\n\n"+
  D.phases.length+" phases, "+D.clusters+" clusters.";
document.getElementById("stats").textContent=D.nodes.length+" nodes, "+D.edges.length+" temporal edges, "+
  D.clusters+" clusters, "+D.phases.length+" phases";
var vb={x:0,y:0,w:Math.min(W,1400),h:H};
function apply(){svg.setAttribute("viewBox",vb.x+" "+vb.y+" "+vb.w+" "+vb.h);}
apply();
svg.addEventListener("wheel",function(ev){ev.preventDefault();var f=ev.deltaY>0?1.15:1/1.15;
  var r=svg.getBoundingClientRect(),px=vb.x+(ev.clientX-r.left)/r.width*vb.w;
  vb.w*=f;vb.h*=f;vb.x=px-(ev.clientX-r.left)/r.width*vb.w;apply();},{passive:false});
var drag=null;
svg.addEventListener("mousedown",function(ev){drag={x:ev.clientX,y:ev.clientY,vx:vb.x,vy:vb.y};});
addEventListener("mouseup",function(){drag=null;});
addEventListener("mousemove",function(ev){if(!drag)return;var r=svg.getBoundingClientRect();
  vb.x=drag.vx-(ev.clientX-drag.x)/r.width*vb.w;vb.y=drag.vy-(ev.clientY-drag.y)/r.height*vb.h;apply();});
svg.setAttribute("data-nodes",String(drawn));
})();
</script></body></html>
"""
