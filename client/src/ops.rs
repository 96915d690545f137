//! The operations view (`#ops`): the cluster (on a gateway), ingest jobs, the tick-by-tick book
//! shards, backfill tasks, and the admin actions on them. Polls
//! `GET /api/v1/ops/{cluster,jobs,shards,backfill}` once a second while
//! open (the last good data stays, with the error, when a poll fails).
//!
//! Admin actions (`POST /api/v1/admin/…`) need the server's token: the first action asks for it
//! in `form#token-form` and keeps it in `sessionStorage` (`millrace.admin_token`) for the tab's
//! life; a 401/403 forgets it and asks again with the server's message. Results and errors show
//! in `#ops-status`.
//!
//! On a gateway of a cluster (`GET /api/v1/ops/cluster` answers) the cluster card comes first:
//! the leading supervisor and its state, `tr.worker-row[data-worker]` with `td.state`
//! (`active`, `leaving`, `inactive`) and `td.running`, `tr.task-row[data-task]` with
//! `td.holders`, the unassigned tasks and the last assignment events (`li.event`).
//!
//! DOM hooks for tests: `tr.job-row[data-instrument][data-kind]` with `td.refcount`;
//! `.shard-bar[data-shard]`; `tr.symbol-row[data-symbol]` with `td.shard`, `select.migrate-target`
//! (shard ids, `-1` = a new shard), `button.migrate`, `button.hotspot` (simulated symbols, `.active`
//! while the simulator reports it hot); `#auto-balance`;
//! `.backfill-row[data-series]` with `progress`, `button.backfill-start` / `.backfill-stop`.

use std::time::Duration;

use leptos::prelude::*;
use serde::de::DeserializeOwned;
use shared::protocol::ops::{
    AdminResult, AutoBalanceReply, AutoBalanceRequest, BackfillReport, BackfillTask, Capacity,
    ClusterReport, ClusterTask, ClusterWorker, HotspotReply, HotspotRequest, JobReport, JobsReport,
    MigrateReply, MigrateRequest, SeriesReply, SeriesRequest, ShardStats, ShardsReport, ShortCause,
    SupervisorState, SymbolStats,
};

use crate::api::{self, FetchError};

const TOKEN_KEY: &str = "millrace.admin_token";

/// An admin action: its request (a `shared` type) and the reply type it is read into.
#[derive(Debug, Clone, PartialEq)]
enum AdminAction {
    Migrate(MigrateRequest),
    AutoBalance(AutoBalanceRequest),
    Hotspot(HotspotRequest),
    BackfillStart(SeriesRequest),
    BackfillStop(SeriesRequest),
}

impl AdminAction {
    /// What it did, as the server says (`result` of its reply).
    async fn send(&self, token: &str) -> Result<AdminResult, FetchError> {
        let r = match self {
            AdminAction::Migrate(r) => {
                api::admin_post::<_, MigrateReply>("/api/v1/admin/shards/migrate", r, token)
                    .await?
                    .result
            }
            AdminAction::AutoBalance(r) => {
                api::admin_post::<_, AutoBalanceReply>(
                    "/api/v1/admin/shards/auto_balance",
                    r,
                    token,
                )
                .await?
                .result
            }
            AdminAction::Hotspot(r) => {
                api::admin_post::<_, HotspotReply>("/api/v1/admin/sim/hotspot", r, token)
                    .await?
                    .result
            }
            AdminAction::BackfillStart(r) => {
                api::admin_post::<_, SeriesReply>("/api/v1/admin/backfill/start", r, token)
                    .await?
                    .result
            }
            AdminAction::BackfillStop(r) => {
                api::admin_post::<_, SeriesReply>("/api/v1/admin/backfill/stop", r, token)
                    .await?
                    .result
            }
        };
        Ok(r)
    }
}

/// The result word shown in `#ops-status`.
fn result_word(r: AdminResult) -> &'static str {
    match r {
        AdminResult::Ok => "ok",
        AdminResult::Started => "started",
        AdminResult::Stopping => "stopping",
        AdminResult::Stopped => "stopped",
        AdminResult::Restarted => "restarted",
        AdminResult::Migrating => "migrating",
    }
}

/// "12s ago" from a server time in ms and the server's clock (heartbeats) or the browser's.
fn ago(ms: Option<i64>) -> String {
    match ms {
        None => "—".into(),
        Some(t) => {
            let secs = ((js_sys::Date::now() as i64 - t) / 1000).max(0);
            format!("{secs}s ago")
        }
    }
}

/// A value polled from `path` every second while the view is open.
fn poll<T: DeserializeOwned + PartialEq + Send + Sync + 'static>(
    path: &'static str,
    errors: RwSignal<Vec<(String, String)>>,
    tick: ReadSignal<u64>,
) -> RwSignal<Option<T>> {
    poll_where(path, errors, tick, false)
}

/// [`poll`]; with `absent_ok`, a 404 means "this server has none" (no data, no error).
fn poll_where<T: DeserializeOwned + PartialEq + Send + Sync + 'static>(
    path: &'static str,
    errors: RwSignal<Vec<(String, String)>>,
    tick: ReadSignal<u64>,
    absent_ok: bool,
) -> RwSignal<Option<T>> {
    let data = RwSignal::new(None::<T>);
    // one request at a time: a slow server is not sent a pile of them
    let busy = StoredValue::new(false);
    Effect::new(move |_| {
        tick.track();
        if busy.get_value() {
            return;
        }
        busy.set_value(true);
        leptos::task::spawn_local(async move {
            let result = api::get_json::<T>(path).await;
            busy.set_value(false);
            errors.update(|e| e.retain(|(p, _)| p != path));
            match result {
                Ok(v) => {
                    if data.with_untracked(|d| d.as_ref() != Some(&v)) {
                        data.set(Some(v));
                    }
                }
                Err(FetchError::Refused { status: 404, .. }) if absent_ok => {
                    if data.with_untracked(Option::is_some) {
                        data.set(None);
                    }
                }
                Err(e) => errors.update(|list| list.push((path.to_string(), e.to_string()))),
            }
        });
    });
    data
}

/// Admin actions: the token, the action waiting for it, the status line.
#[derive(Clone, Copy)]
struct Admin {
    token: RwSignal<Option<String>>,
    waiting: RwSignal<Option<(AdminAction, String)>>,
    status: RwSignal<(bool, String)>,
    refresh: WriteSignal<u64>,
}

impl Admin {
    fn storage() -> Option<web_sys::Storage> {
        web_sys::window()?.session_storage().ok()?
    }

    fn new(refresh: WriteSignal<u64>) -> Admin {
        let stored = Self::storage()
            .and_then(|s| s.get_item(TOKEN_KEY).ok().flatten())
            .filter(|t| !t.is_empty());
        Admin {
            token: RwSignal::new(stored),
            waiting: RwSignal::new(None),
            status: RwSignal::new((true, String::new())),
            refresh,
        }
    }

    fn set_token(self, token: Option<String>) {
        if let Some(s) = Self::storage() {
            let _ = match &token {
                Some(t) => s.set_item(TOKEN_KEY, t),
                None => s.remove_item(TOKEN_KEY),
            };
        }
        self.token.set(token);
    }

    /// Runs `action`, asking for the token first if there is none.
    fn run(self, action: AdminAction, label: String) {
        let Some(token) = self.token.get_untracked() else {
            self.waiting.set(Some((action, label)));
            self.status.set((true, "admin token needed".into()));
            return;
        };
        self.status.set((true, format!("{label}…")));
        leptos::task::spawn_local(async move {
            match action.send(&token).await {
                Ok(result) => {
                    self.status.set((true, format!("{label}: {}", result_word(result))));
                    self.refresh.update(|t| *t += 1);
                }
                Err(e) if e.is_unauthorized() => {
                    self.set_token(None);
                    self.waiting.set(Some((action, label)));
                    self.status.set((false, format!("token refused: {}", e.message())));
                }
                Err(e) => self.status.set((false, format!("{label} failed: {e}"))),
            }
        });
    }
}

/// The operations view.
#[component]
pub fn OpsView() -> impl IntoView {
    let (tick, set_tick) = signal(0u64);
    if let Ok(h) =
        set_interval_with_handle(move || set_tick.update(|t| *t += 1), Duration::from_millis(1000))
    {
        on_cleanup(move || h.clear());
    }
    let errors = RwSignal::new(Vec::<(String, String)>::new());
    let jobs = poll::<JobsReport>("/api/v1/ops/jobs", errors, tick);
    let shards = poll::<ShardsReport>("/api/v1/ops/shards", errors, tick);
    let backfill = poll::<BackfillReport>("/api/v1/ops/backfill", errors, tick);
    let cluster = poll_where::<ClusterReport>("/api/v1/ops/cluster", errors, tick, true);
    let admin = Admin::new(set_tick);

    view! {
        <div class="ops">
            <p id="ops-errors" class="error" class:hidden=move || errors.with(Vec::is_empty)>
                {move || errors.with(|e| e.iter().map(|(_, m)| m.clone()).collect::<Vec<_>>().join(" · "))}
                " (showing the last data received)"
            </p>
            <TokenForm admin=admin />
            <p id="ops-status" class:error=move || !admin.status.get().0>{move || admin.status.get().1}</p>
            <ClusterCard cluster=cluster />
            <JobsCard jobs=jobs />
            <ShardsCard shards=shards admin=admin />
            <BackfillCard backfill=backfill admin=admin />
        </div>
    }
}

#[component]
fn TokenForm(admin: Admin) -> impl IntoView {
    let input = NodeRef::<leptos::html::Input>::new();
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let value = input.get().map(|i| i.value()).unwrap_or_default();
        if value.is_empty() {
            return;
        }
        admin.set_token(Some(value));
        if let Some((action, label)) = admin.waiting.get_untracked() {
            admin.waiting.set(None);
            admin.run(action, label);
        }
    };
    view! {
        <form id="token-form" class="card token-form" class:hidden=move || admin.waiting.with(Option::is_none) on:submit=submit>
            <label for="admin-token">"Admin token for "<b>{move || admin.waiting.with(|w| w.as_ref().map(|(_, l)| l.clone()).unwrap_or_default())}</b></label>
            <input id="admin-token" type="password" autocomplete="off" node_ref=input />
            <button type="submit">"Run"</button>
            <button type="button" on:click=move |_| admin.waiting.set(None)>"Cancel"</button>
            <span class="muted detail">"kept for this tab only (sessionStorage)"</span>
        </form>
    }
}

fn capacity_line(label: &'static str, c: &Capacity) -> String {
    format!(
        "{label}: {} pinned, {} / {} on demand (idle jobs stop after {} s), {} evicted, {} refused, {} preempted",
        c.pinned_jobs,
        c.ondemand_jobs,
        c.ondemand_max_jobs,
        c.ondemand_idle_ttl_s,
        c.evictions,
        c.refusals,
        c.preemptions
    )
}

/// `f` of the value, or the default text while there is none.
fn or_blank<T, R: Default>(v: &Option<T>, f: impl FnOnce(&T) -> R) -> R {
    v.as_ref().map(f).unwrap_or_default()
}

#[component]
fn JobsCard(jobs: RwSignal<Option<JobsReport>>) -> impl IntoView {
    let all = Memo::new(move |_| {
        jobs.with(|j| {
            j.as_ref()
                .map(|j| {
                    j.jobs
                        .iter()
                        .chain(j.depth.jobs.iter().map(|d| &d.job))
                        .cloned()
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        })
    });
    let row = move |key: (String, &'static str)| {
        let job = Memo::new(move |_| {
            all.with(|a| {
                a.iter()
                    .find(|j| j.instrument.to_string() == key.0 && j.kind.as_str() == key.1)
                    .cloned()
            })
        });
        let f = move |g: fn(&JobReport) -> String| move || job.with(|j| or_blank(j, g));
        view! {
            <tr class="job-row" data-instrument=f(|j| j.instrument.to_string()) data-kind=f(|j| j.kind.as_str().into())>
                <td class="mono">{f(|j| j.instrument.to_string())}</td>
                <td>{f(|j| j.kind.as_str().into())}</td>
                <td>{f(|j| if j.pinned { "pinned".into() } else { "on demand".into() })}</td>
                <td class="refcount mono num">{f(|j| if j.refcount < 0 { "—".into() } else { j.refcount.to_string() })}</td>
                <td class="mono">{f(|j| if j.refcount == 0 { ago(j.idle_since_ms) } else { "—".into() })}</td>
                <td class="mono num">{f(|j| j.crashes.to_string())}</td>
                <td class="mono num">{f(|j| j.messages.to_string())}</td>
                <td>{f(|j| if j.connected { "connected".into() } else { "down".into() })}</td>
                <td class="last-error">{f(|j| j.last_error.clone().unwrap_or_default())}</td>
            </tr>
        }
    };
    view! {
        <section class="card ops-card">
            <h2>"Ingest jobs"</h2>
            <p class="muted detail">{move || jobs.with(|j| or_blank(j, |j| capacity_line("candles", &j.capacity)))}</p>
            <p class="muted detail">{move || jobs.with(|j| or_blank(j, |j| capacity_line("books", &j.depth.capacity)))}</p>
            <div class="table-scroll">
                <table>
                    <thead><tr><th>"instrument"</th><th>"kind"</th><th>"mode"</th><th>"refcount"</th><th>"idle since"</th><th>"crashes"</th><th>"messages"</th><th>"feed"</th><th>"last error"</th></tr></thead>
                    <tbody>
                        <For each=move || all.with(|a| a.iter().map(|j| (j.instrument.to_string(), j.kind.as_str())).collect::<Vec<_>>()) key=|k| k.clone() children=row />
                    </tbody>
                </table>
            </div>
        </section>
    }
}

#[component]
fn ShardsCard(shards: RwSignal<Option<ShardsReport>>, admin: Admin) -> impl IntoView {
    let engine = Memo::new(move |_| shards.with(|s| s.as_ref().map(|s| s.engine.clone())));
    let shard_ids = Memo::new(move |_| {
        engine.with(|e| or_blank(e, |e| e.shards.iter().map(|s| s.id).collect::<Vec<_>>()))
    });
    let bar = move |id: u32| {
        let shard =
            Memo::new(move |_| engine.with(|e| e.as_ref().and_then(|e| e.shard(id).cloned())));
        let max = Memo::new(move |_| {
            engine
                .with(|e| or_blank(e, |e| e.shards.iter().map(|s| s.pending).max().unwrap_or(0)))
                .max(1)
        });
        let f = move |g: fn(&ShardStats) -> String| move || shard.with(|s| or_blank(s, g));
        view! {
            <div class="shard-bar" data-shard=id>
                <span class="mono">"shard "{id}</span>
                <span class="track"><span class="fill" style=move || format!("width:{:.1}%", shard.with(|s| or_blank(s, |s| s.pending)) as f64 * 100.0 / max.get() as f64)></span></span>
                <span class="mono num">{f(|s| s.pending.to_string())}" pending"</span>
                <span class="muted mono">{f(|s| format!("{} sym · {}/s · lag {} ms", s.symbols, s.processed_per_s, s.lag_ms))}</span>
                <span class="muted top-pending">{f(|s| s.top_pending.iter().map(|p| format!("{} {}", p.instrument, p.pending)).collect::<Vec<_>>().join(", "))}</span>
            </div>
        }
    };
    let row = move |instrument: String| {
        let key = instrument.clone();
        let sym = Memo::new(move |_| {
            engine.with(|e| {
                e.as_ref().and_then(|e| {
                    e.symbols.iter().find(|s| s.instrument.to_string() == key).cloned()
                })
            })
        });
        let target = RwSignal::new(None::<i64>);
        let (migrate_name, hot_name) = (instrument.clone(), instrument.clone());
        let f = move |g: fn(&SymbolStats) -> String| move || sym.with(|s| or_blank(s, g));
        view! {
            <tr class="symbol-row" data-symbol=instrument.clone()>
                <td class="mono">{instrument.clone()}</td>
                <td>{f(|s| s.venue.as_str().into())}</td>
                <td class="shard mono num">{f(|s| s.shard.to_string())}</td>
                <td class="mono num">{f(|s| s.pending.to_string())}</td>
                <td class="mono num">{f(|s| s.lag_ms.to_string())}</td>
                <td class="rate mono num">{f(|s| s.processed_per_s.to_string())}</td>
                <td>{f(|s| if s.migrating { "migrating".into() } else { s.health.as_str().into() })}</td>
                <td class="actions">
                    <select class="migrate-target" on:change=move |ev| target.set(event_target_value(&ev).parse().ok())>
                        <option value="" selected=move || target.get().is_none()>"move to…"</option>
                        {move || shard_ids.get().into_iter().map(|id| view! { <option value=id.to_string() selected=move || target.get() == Some(i64::from(id))>"shard "{id}</option> }).collect_view()}
                        <option value="-1" selected=move || target.get() == Some(-1)>"a new shard"</option>
                    </select>
                    <button class="migrate" disabled=move || target.get().is_none() on:click=move |_| {
                        if let Some(t) = target.get_untracked() {
                            let where_ = if t < 0 { "a new shard".to_string() } else { format!("shard {t}") };
                            let action = AdminAction::Migrate(MigrateRequest { symbol: migrate_name.clone(), target: t });
                            admin.run(action, format!("migrate {migrate_name} to {where_}"));
                        }
                    }>"migrate"</button>
                    {move || sym.with(|s| s.as_ref().and_then(|s| s.hot)).map(|on| {
                        let name = hot_name.clone();
                        view! {
                            <button class="hotspot" class:active=on title="simulator hot spot: this symbol's order rate x2000" on:click=move |_| {
                                let action = AdminAction::Hotspot(HotspotRequest { symbol: name.clone(), hot: !on });
                                admin.run(action, format!("hot spot {} {name}", if on { "off" } else { "on" }));
                            }>{if on { "hot ✓" } else { "hot" }}</button>
                        }
                    })}
                </td>
            </tr>
        }
    };
    view! {
        <section class="card ops-card">
            <h2>"Book shards"</h2>
            <div class="shard-head">
                <label><input id="auto-balance" type="checkbox" prop:checked=move || engine.with(|e| or_blank(e, |e| e.auto_balance))
                    on:change=move |ev| {
                        let on = event_target_checked(&ev);
                        admin.run(AdminAction::AutoBalance(AutoBalanceRequest { on }), format!("auto-balance {}", if on { "on" } else { "off" }));
                    } />" auto-balance"</label>
                <span class="muted detail">{move || engine.with(|e| or_blank(e, |e| format!("{} shards (max {}) · migrations: {}", e.shards.len(), e.max_shards, e.migrations.completed)))}</span>
            </div>
            <div class="shard-bars">
                <For each=move || shard_ids.get() key=|id| *id children=bar />
            </div>
            <div class="table-scroll">
                <table>
                    <thead><tr><th>"symbol"</th><th>"venue"</th><th>"shard"</th><th>"pending"</th><th>"lag ms"</th><th>"events/s"</th><th>"health"</th><th>"actions"</th></tr></thead>
                    <tbody>
                        <For each=move || engine.with(|e| or_blank(e, |e| e.symbols.iter().map(|s| s.instrument.to_string()).collect::<Vec<_>>())) key=|k| k.clone() children=row />
                    </tbody>
                </table>
            </div>
        </section>
    }
}

#[component]
fn BackfillCard(backfill: RwSignal<Option<BackfillReport>>, admin: Admin) -> impl IntoView {
    let tasks = Memo::new(move |_| {
        backfill.with(|b| b.as_ref().map(|b| b.tasks.clone()).unwrap_or_default())
    });
    // In a cluster, the node holding the persister lease backfills; elsewhere starts are refused.
    let here = Memo::new(move |_| backfill.with(|b| b.as_ref().is_none_or(|b| b.runs_here)));
    let row = move |series: String| {
        let key = series.clone();
        let task = Memo::new(move |_| {
            tasks.with(|t| t.iter().find(|x| x.series.to_string() == key).cloned())
        });
        let (start, stop) = (series.clone(), series.clone());
        let progress = move || task.with(|t| or_blank(t, |t| t.progress));
        let running = move || task.with(|t| or_blank(t, |t| t.running));
        let f = move |g: fn(&BackfillTask) -> String| move || task.with(|t| or_blank(t, g));
        view! {
            <div class="backfill-row" data-series=series.clone()>
                <span class="mono">{series.clone()}</span>
                <progress max="1" value=progress></progress>
                <span class="mono num">{move || format!("{:.0}%", progress() * 100.0)}</span>
                <span>{f(|t| t.state.as_str().into())}</span>
                <span class="mono muted">{f(|t| format!("{} candles", t.candles_written))}</span>
                <span class="muted">{f(|t| t.last_error.clone().or_else(|| t.stop_reason.clone()).unwrap_or_default())}</span>
                <button class="backfill-start" disabled=move || running() || !here.get()
                    on:click=move |_| admin.run(AdminAction::BackfillStart(SeriesRequest { series: start.clone() }), format!("start backfill {start}"))>"start"</button>
                <button class="backfill-stop" disabled=move || !running()
                    on:click=move |_| admin.run(AdminAction::BackfillStop(SeriesRequest { series: stop.clone() }), format!("stop backfill {stop}"))>"stop"</button>
            </div>
        }
    };
    view! {
        <section class="card ops-card">
            <h2>"Backfill"</h2>
            <p class="muted backfill-elsewhere" hidden=move || here.get()>
                "Another node of the cluster backfills: the holder of the persister lease."
            </p>
            <For each=move || tasks.with(|t| t.iter().map(|x| x.series.to_string()).collect::<Vec<_>>()) key=|k| k.clone() children=row />
        </section>
    }
}

fn state_word(s: SupervisorState) -> &'static str {
    match s {
        SupervisorState::Standby => "standby",
        SupervisorState::WarmingUp => "warming up",
        SupervisorState::AwaitingTasks => "awaiting the task list",
        SupervisorState::Running => "running",
    }
}

fn worker_state(w: &ClusterWorker) -> String {
    if !w.active {
        "inactive".into()
    } else if w.leaving {
        "leaving".into()
    } else {
        "active".into()
    }
}

fn age_ms(ms: Option<u64>) -> String {
    ms.map(|m| format!("{:.1} s", m as f64 / 1000.0)).unwrap_or_else(|| "—".into())
}

#[component]
fn ClusterCard(cluster: RwSignal<Option<ClusterReport>>) -> impl IntoView {
    let workers = Memo::new(move |_| {
        cluster
            .with(|c| or_blank(c, |c| c.workers.iter().map(|w| w.id.clone()).collect::<Vec<_>>()))
    });
    let tasks = Memo::new(move |_| {
        cluster.with(|c| or_blank(c, |c| c.tasks.iter().map(|t| t.id.clone()).collect::<Vec<_>>()))
    });
    let worker_row = move |id: String| {
        let key = id.clone();
        let w = Memo::new(move |_| {
            cluster
                .with(|c| c.as_ref().and_then(|c| c.workers.iter().find(|w| w.id == key).cloned()))
        });
        let f = move |g: fn(&ClusterWorker) -> String| move || w.with(|w| or_blank(w, g));
        view! {
            <tr class="worker-row" data-worker=id.clone()>
                <td class="mono">{id.clone()}</td>
                <td class="state">{f(worker_state)}</td>
                <td class="running mono num">{f(|w| w.running.to_string())}</td>
                <td class="mono num">{f(|w| w.max_load.to_string())}</td>
                <td class="mono">{f(|w| age_ms(Some(w.last_seen_ms)))}</td>
            </tr>
        }
    };
    let task_row = move |id: String| {
        let key = id.clone();
        let t = Memo::new(move |_| {
            cluster.with(|c| c.as_ref().and_then(|c| c.tasks.iter().find(|t| t.id == key).cloned()))
        });
        let f = move |g: fn(&ClusterTask) -> String| move || t.with(|t| or_blank(t, g));
        view! {
            <tr class="task-row" data-task=id.clone()>
                <td class="mono">{id.clone()}</td>
                <td class="holders mono">{f(|t| t.workers.join(", "))}</td>
                <td class="mono">{f(|t| age_ms(t.last_data_age_ms))}</td>
            </tr>
        }
    };
    view! {
        <section id="cluster-card" class="card ops-card" class:hidden=move || cluster.with(Option::is_none)>
            <h2>"Cluster"</h2>
            <p class="muted detail supervisor">{move || cluster.with(|c| or_blank(c, |c| {
                let s = &c.supervisor;
                let warm = s.warmup_remaining_ms.map(|m| format!(" ({:.0} s of warm-up left)", m as f64 / 1000.0)).unwrap_or_default();
                format!("leader {} · {}{warm} · epoch {} · redundancy {}", s.leader.as_deref().unwrap_or("none"), state_word(s.state), s.epoch, s.redundancy)
            }))}</p>
            <div class="table-scroll">
                <table>
                    <thead><tr><th>"worker"</th><th>"state"</th><th>"running"</th><th>"max load"</th><th>"last status"</th></tr></thead>
                    <tbody><For each=move || workers.get() key=|k| k.clone() children=worker_row /></tbody>
                </table>
            </div>
            <div class="table-scroll">
                <table>
                    <thead><tr><th>"task"</th><th>"workers"</th><th>"last data"</th></tr></thead>
                    <tbody><For each=move || tasks.get() key=|k| k.clone() children=task_row /></tbody>
                </table>
            </div>
            <p class="unassigned" class:error=move || cluster.with(|c| or_blank(c, |c| !c.unassigned.is_empty()))>
                {move || cluster.with(|c| or_blank(c, |c| if c.unassigned.is_empty() { "every task fully assigned".to_string() } else {
                    c.unassigned.iter().map(|u| format!("{} short of {} ({})", u.task, u.missing, match u.cause { ShortCause::NoCapacity => "no capacity", ShortCause::FewWorkers => "too few workers" })).collect::<Vec<_>>().join(" · ")
                }))}
            </p>
            <ul class="events">
                {move || cluster.with(|c| or_blank(c, |c| c.events.iter().rev().take(8).map(|e| {
                    let text = format!("{}: +{} −{}{}", e.reason, e.added, e.ended, if e.unassigned > 0 { format!(", {} unassigned", e.unassigned) } else { String::new() });
                    view! { <li class="event mono">{text}</li> }
                }).collect::<Vec<_>>()))}
            </ul>
        </section>
    }
}
