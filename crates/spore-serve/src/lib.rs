//! `spore serve`: a serverless platform on spore microVMs that speaks the
//! AWS Lambda API. Deploy a function once (its code, as a zip, in the
//! catalogue), invoke it many times: each invocation gets an idle warm
//! instance, a clone of the function's zygote, or a cold boot that also makes
//! the zygote.
//!
//! The daemon is only a client of `spore vmm` processes (their API sockets
//! and vsock), never a second VMM: a VMM crash or exploit stays in one
//! instance, and the daemon can be killed and restarted without losing a
//! deployed function.
//!
//! Modules, from the top (each imports only modules below it; see
//! `docs/ARCHITECTURE.md`): [`server`] (the API's connections, bounded) →
//! [`api`] (the Lambda HTTP API; [`auth`] checks
//! its signatures) → [`instances`] (pools, admission, start paths) →
//! [`snapshots`] and [`bases`] (function and runtime-base snapshots) →
//! [`catalog`] (SQLite), [`events`] (accepted `Event` invocations, on
//! disk), [`code`] (zips and code disks), [`runtime`],
//! [`images`], [`logs`], [`metrics`], [`recovery`] ([`guardian`]: the
//! process that cleans up after a dead daemon) → the VMM client:
//! [`vmm`] (VMM processes; [`vmm_exit`]: how one ended), [`instance_conn`] (the invoke protocol over
//! vsock), [`network`] → [`fs`], [`clock`], [`mutex`], [`config`].

pub mod account_slots;
pub mod accounts;
pub mod api;
pub mod auth;
pub mod bases;
pub mod catalog;
pub mod cgroups;
pub mod clock;
pub mod cluster;
pub mod cluster_follow;
pub mod code;
pub mod config;
pub mod connections;
pub mod events;
pub mod fs;
pub mod guardian;
pub mod images;
pub mod instance_conn;
pub mod instances;
pub mod jail;
pub mod logs;
pub mod metrics;
pub mod mutex;
pub mod network;
pub mod percent;
pub mod recovery;
pub mod runtime;
pub mod runtime_image;
pub mod sandbox_memory;
pub mod sandboxes;
pub mod server;
pub mod snapshots;
pub mod vmm;
pub mod vmm_exit;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
/// `spore image` builds code disks too (`spore_serve::code_disk::build`).
pub use code::disk as code_disk;
pub use instances::InstancesConfig;

/// What `spore serve` was asked for.
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub instances: InstancesConfig,
    /// `--auth keys.toml`: verify SigV4 signatures against these keys.
    pub auth_keys: Option<PathBuf>,
    /// How `Event` invocations are queued and retried.
    pub events: events::EventsConfig,
    /// How the API's connections are bounded.
    pub connections: server::ConnLimits,
    /// `--url-listen`: where function URLs are served (none: not served).
    pub url_listen: Option<SocketAddr>,
    /// `--url-domain`: function URLs as `<url-id>.lambda-url.<region>.<domain>`
    /// host names instead of path prefixes.
    pub url_domain: Option<String>,
    /// `--cluster`: the catalogue in etcd, this daemon one node of many.
    pub cluster: Option<cluster::NodeOptions>,
    /// `--sandbox-listen`: E2B's sandbox API and proxy, and its templates.
    pub sandboxes: Option<sandboxes::SandboxConfig>,
}

/// Runs the daemon until SIGINT or SIGTERM: recovers from a previous
/// daemon's leftovers, opens the catalogue, serves the API. Prints
/// `{"listen":"ADDR"}` on stdout once serving.
pub fn run(config: ServeConfig) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("spore-serve")
        .build()?;
    runtime.block_on(serve(config))
}

/// A single daemon's catalogue, or this node's copy of the cluster's.
fn open_catalog(
    state_dir: &std::path::Path,
    cluster: Option<&cluster::NodeOptions>,
) -> anyhow::Result<Arc<catalog::Catalog>> {
    let path = state_dir.join("catalog.db");
    let catalog = match cluster {
        Some(node) => catalog::Catalog::open_member(&path, &node.cluster),
        None => catalog::Catalog::open(&path),
    }
    .with_context(|| format!("opening the catalogue in {}", state_dir.display()))?;
    Ok(Arc::new(catalog))
}

/// Reserved and provisioned concurrency as the catalogue sets them.
async fn set_concurrency(
    catalog: &catalog::Catalog,
    instances: &Arc<instances::Instances>,
) -> anyhow::Result<()> {
    for f in catalog.list()? {
        if let Some(n) = f.reserved_concurrency {
            instances.set_reserved(&f.name, Some(n));
        }
    }
    for name in catalog.provisioned_functions()? {
        instances.sync_provisioned(&name).await;
    }
    Ok(())
}

/// Accepted events also in etcd (another node runs them if this one
/// dies), this node's queue squared with its copies there first.
async fn replicate_events(
    node: &Arc<cluster::Node>,
    events: &Arc<events::EventQueue>,
) -> anyhow::Result<()> {
    events.set_replica(Box::new(cluster::EtcdEvents::new(node.clone())));
    cluster::reconcile_events(node, events)
        .await
        .map_err(|e| anyhow::anyhow!("cluster: this node's events in etcd: {e}"))?;
    cluster::spawn_takeover(node.clone(), events.clone());
    Ok(())
}

/// Registers this daemon as a cluster node and follows what other nodes
/// change (`--cluster`).
async fn join_cluster(
    options: cluster::NodeOptions,
    memory_budget: u64,
    catalog: &Arc<catalog::Catalog>,
    instances: &Arc<instances::Instances>,
    state_dir: &std::path::Path,
) -> anyhow::Result<Arc<cluster::Node>> {
    let capacity = cluster::Capacity::of_this_host(memory_budget);
    let node = cluster::Node::start(options, capacity, catalog.clone()).await?;
    instances.join_cluster(node.clone());
    cluster_follow::spawn(&node, catalog, instances, state_dir);
    cluster_follow::spawn_replication(&node, catalog, instances, state_dir);
    // What this node holds, for every node's placement: once a second,
    // published when it changed.
    let (publisher, held_of) = (node.clone(), instances.clone());
    tokio::spawn(async move {
        loop {
            publisher.publish_held(held_of.held().await).await;
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    });
    tracing::info!(node = %node.cluster.node_id, advertise = %node.advertise, "joined the cluster");
    Ok(node)
}

/// The keys file's keys (`--auth`) and every account.
fn open_accounts(
    keys_file: Option<&std::path::Path>,
    node: Option<&Arc<cluster::Node>>,
) -> anyhow::Result<(Option<auth::Keys>, Arc<accounts::Accounts>)> {
    let auth = keys_file.map(auth::Keys::load).transpose()?;
    let accounts = Arc::new(accounts::Accounts::new(
        auth.iter().flat_map(auth::Keys::accounts),
    ));
    if let Some(node) = node {
        accounts.set_clustered();
        account_slots::spawn_fence_follower(node, accounts.clone());
    }
    Ok((auth, accounts))
}

/// Every 250 ms: idle instances past their keep-alive ended, provisioned
/// pools refilled, and (in a cluster) concurrency slots no instance needs
/// given back.
fn spawn_reaper(daemon: Arc<api::Daemon>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let instances = &daemon.instances;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tick.tick().await;
            instances.reap_idle().await;
            instances.refill_all();
            instances.release_idle_slots().await;
            if let Some(node) = &daemon.cluster {
                account_slots::release_idle(node, &daemon.accounts, instances).await;
            }
        }
    })
}

/// The event queue a previous daemon left, found again.
fn open_events(
    state_dir: &Path,
    config: events::EventsConfig,
) -> anyhow::Result<Arc<events::EventQueue>> {
    let (events, found) = events::EventQueue::open(&state_dir.join("events"), config)
        .with_context(|| format!("opening the event queue in {}", state_dir.display()))?;
    if found.events > 0 || found.temp_removed > 0 || found.corrupt > 0 {
        tracing::info!(
            "event queue: {} events from a previous daemon queued again, {} half-written files removed, {} unreadable set aside (*.corrupt)",
            found.events, found.temp_removed, found.corrupt
        );
    }
    Ok(Arc::new(events))
}

/// The sandbox API's state: its VMMs jailed as instances' are (`jail`,
/// `None` with `--no-jail`), on the instances' networks.
fn open_sandboxes(
    spore_bin: &Path,
    state_dir: &Path,
    config: sandboxes::SandboxConfig,
    (instances, accounts): (&Arc<instances::Instances>, &Arc<accounts::Accounts>),
    jail: Option<jail::Jail>,
) -> anyhow::Result<Arc<sandboxes::Sandboxes>> {
    let shared = (instances.clone(), accounts.clone());
    sandboxes::Sandboxes::open(spore_bin, state_dir, config, shared, jail)
}

async fn serve(mut config: ServeConfig) -> anyhow::Result<()> {
    let state_dir: PathBuf = config.instances.state_dir.clone();
    let spore_bin = config.instances.spore_bin.clone();
    let sandbox_config = config.sandboxes.take();
    let sandbox_listen = sandbox_config.as_ref().map(|c| c.listen);
    let _lock = take_state_dir(&state_dir, config.instances.jail.is_none())?;
    if let Some(cgroups) = &config.instances.cgroups {
        cgroups.remove_leftovers();
    }
    // First, as it needs no disk room: a full disk must not keep a dead
    // daemon's VMMs running, and removing its leftovers frees room.
    let report = recovery::recover(&state_dir)?;
    let catalog = open_catalog(&state_dir, config.cluster.as_ref())?;
    recovery::forget_processes(&catalog)?;
    jail::set_up(config.instances.jail, &catalog, &state_dir)?;
    if report.killed > 0 || report.removed > 0 {
        tracing::info!(
            "recovered from a previous daemon: {} VMM processes ended, {} leftovers removed",
            report.killed,
            report.removed
        );
    }
    // From here on, whatever ends this daemon, its guardian ends what it
    // started.
    let _guardian = match guardian::Guardian::start(
        &config.instances.spore_bin,
        &state_dir,
        &config.instances.net_pool,
    ) {
        Ok(g) => Some(g),
        Err(e) => {
            tracing::warn!(
                "no guardian: instances would outlive a killed daemon until its next start: {e:#}"
            );
            None
        }
    };
    let memory_budget = config.instances.memory_budget;
    let uid_range = config.instances.jail;
    let instances = instances::Instances::new(config.instances, catalog.clone());
    let node = match config.cluster.clone() {
        Some(options) => {
            Some(join_cluster(options, memory_budget, &catalog, &instances, &state_dir).await?)
        }
        None => None,
    };
    if let Some(g) = &_guardian {
        instances.census_skip(g.pid());
    }
    let net_removed = instances.remove_network_leftovers().await;
    if net_removed > 0 {
        tracing::info!(
            "recovered from a previous daemon: {net_removed} network namespaces, veths or NAT tables removed"
        );
    }
    let stale = instances.recover_snapshots();
    if stale > 0 {
        tracing::info!("{stale} stale or half-written snapshots removed");
    }
    set_concurrency(&catalog, &instances).await?;
    let events = open_events(&state_dir, config.events.clone())?;
    if let Some(node) = &node {
        replicate_events(node, &events).await?;
    }
    let (auth, accounts) = open_accounts(config.auth_keys.as_deref(), node.as_ref())?;
    let jail = uid_range.map(|r| jail::Jail::new(r, catalog.clone()));
    let sandboxes = sandbox_config
        .map(|c| open_sandboxes(&spore_bin, &state_dir, c, (&instances, &accounts), jail))
        .transpose()?;
    let daemon = Arc::new(api::Daemon {
        state_dir,
        catalog,
        instances: instances.clone(),
        admin: tokio::sync::Mutex::new(()),
        auth,
        accounts,
        events: events.clone(),
        connections: Arc::new(connections::Connections::default()),
        url_base: std::sync::OnceLock::new(),
        cluster: node,
        sandboxes,
    });
    let dispatcher = api::spawn_event_dispatcher(daemon.clone());
    let (listener, url_listener, sandbox_listener) = listen_and_announce(
        Listens {
            api: config.listen,
            urls: config.url_listen,
            url_domain: config.url_domain.clone(),
            sandboxes: sandbox_listen,
        },
        &daemon,
    )?;
    let sandbox_background =
        (daemon.sandboxes.as_ref()).map(|s| s.spawn_background(daemon.auth.is_none()));

    let reaper = spawn_reaper(daemon.clone());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut limits = config.connections;
    limits.max_connections = server::fit_descriptor_limit(limits.max_connections);
    let stop = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    let side_servers: Vec<_> = [
        (url_listener, server::Endpoint::FunctionUrls),
        (sandbox_listener, server::Endpoint::Sandboxes),
    ]
    .into_iter()
    .filter_map(|(l, endpoint)| {
        let l = l?;
        Some(tokio::spawn(server::serve(
            l,
            daemon.clone(),
            limits,
            endpoint,
            std::future::pending(),
        )))
    })
    .collect();
    server::serve(
        listener,
        daemon.clone(),
        limits,
        server::Endpoint::Api,
        stop,
    )
    .await;
    for s in side_servers.into_iter().chain(sandbox_background) {
        s.abort();
    }
    if let Some(sandboxes) = &daemon.sandboxes {
        sandboxes.shutdown().await;
    }
    tracing::info!("spore serve: stopping; ending every instance");
    dispatcher.abort();
    let kept = events.queued();
    if kept > 0 {
        tracing::info!("{kept} Event invocations stay queued on disk for the next start");
    }
    reaper.abort();
    instances.shutdown().await;
    if let Some(node) = &daemon.cluster {
        node.leave().await;
    }
    Ok(())
}

/// The addresses `spore serve` listens on.
struct Listens {
    api: SocketAddr,
    urls: Option<SocketAddr>,
    url_domain: Option<String>,
    sandboxes: Option<SocketAddr>,
}

type Listeners = (
    tokio::net::TcpListener,
    Option<tokio::net::TcpListener>,
    Option<tokio::net::TcpListener>,
);

/// Binds the API's listener (and `--url-listen`'s, `--sandbox-listen`'s),
/// then prints `{"listen":ADDR[,"url_listen":ADDR][,"sandbox_listen":ADDR]}`
/// on stdout: the daemon serves from here on.
fn listen_and_announce(at: Listens, daemon: &api::Daemon) -> anyhow::Result<Listeners> {
    let bind = |a: SocketAddr| server::listen(a).with_context(|| format!("listening on {a}"));
    let listener = bind(at.api)?;
    let addr = listener.local_addr()?;
    let url_listener = at.urls.map(bind).transpose()?;
    let sandbox_listener = at.sandboxes.map(bind).transpose()?;
    let url_addr = url_listener.as_ref().map(|l| l.local_addr()).transpose()?;
    let sandbox_addr = sandbox_listener
        .as_ref()
        .map(|l| l.local_addr())
        .transpose()?;
    if let Some(a) = url_addr {
        let _ = daemon.url_base.set(api::UrlBase::new(a, at.url_domain));
    }
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let mut line = serde_json::json!({ "listen": addr.to_string() });
        if let Some(a) = url_addr {
            line["url_listen"] = a.to_string().into();
        }
        if let Some(a) = sandbox_addr {
            line["sandbox_listen"] = a.to_string().into();
        }
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    tracing::info!("spore serve: Lambda API on http://{addr}");
    if let Some(a) = url_addr {
        tracing::info!("spore serve: function URLs on http://{a}");
    }
    if let Some(a) = sandbox_addr {
        tracing::info!("spore serve: sandbox API and proxy on http://{a}");
    }
    Ok((listener, url_listener, sandbox_listener))
}

/// Makes and locks the state directory; `restricted`: owner only.
fn take_state_dir(state_dir: &std::path::Path, restricted: bool) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating the state directory {}", state_dir.display()))?;
    check_socket_room(state_dir)?;
    let lock = lock_state_dir(state_dir)?;
    // After the lock: a daemon refused the directory changes nothing in
    // it (a jailed daemon's VMMs pass through it; `Jail` sets its mode).
    if restricted {
        restrict(state_dir);
    }
    Ok(lock)
}

/// Longest state directory path: VMM sockets go under `<state>/run/r<n>/clones/`
/// with names of up to about 40 bytes, and a Unix socket path has at most 107.
const MAX_STATE_DIR_BYTES: usize = 60;

fn check_socket_room(state_dir: &std::path::Path) -> anyhow::Result<()> {
    let len = state_dir.as_os_str().len();
    if len > MAX_STATE_DIR_BYTES {
        anyhow::bail!(
            "the state directory {} is {len} bytes long; the VMM sockets under it need it to be at most {MAX_STATE_DIR_BYTES} (Unix socket paths are limited to 107 bytes)",
            state_dir.display()
        );
    }
    Ok(())
}

/// How long a starting daemon waits for the state directory's lock: the
/// previous daemon's guardian holds it while it cleans up.
const LOCK_WAIT: Duration = Duration::from_secs(15);

/// One daemon per state directory: a second one is refused instead of
/// ending the first one's VMMs as leftovers.
fn lock_state_dir(state_dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    fs::lock_for(&state_dir.join(fs::STATE_LOCK), LOCK_WAIT)?.ok_or_else(|| {
        anyhow::anyhow!(
            "another spore serve is using the state directory {}",
            state_dir.display()
        )
    })
}

/// The state directory holds code and sockets: owner only.
fn restrict(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
}
