//! Event invocations across nodes: a node keeps a copy of each event it
//! accepted in etcd (`<prefix>events/<node-id>/<file name>`) before its
//! 202 and deletes it once the event ran or was dropped. Every node looks
//! for copies under nodes that are gone (absent from the membership twice
//! in a row, 2 s apart) and claims them in a transaction (the key moved
//! under itself only if nobody moved it first), then runs them: an event a
//! dead node accepted runs at least once.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};

use super::Node;
use crate::events::{EventQueue, EventReplica};

/// How often a node looks for a dead node's events.
const TAKEOVER_EVERY: Duration = Duration::from_secs(2);
/// How long keeping a copy may take before the event is refused.
const KEEP_TIMEOUT: Duration = Duration::from_secs(5);

fn dir(node: &Node) -> String {
    format!("{}events/", node.cluster.prefix)
}

/// This node's copies in etcd.
pub struct EtcdEvents {
    node: Arc<Node>,
    runtime: tokio::runtime::Handle,
}

impl EtcdEvents {
    pub fn new(node: Arc<Node>) -> Self {
        EtcdEvents {
            node,
            runtime: tokio::runtime::Handle::current(),
        }
    }

    fn key(&self, name: &str) -> String {
        format!("{}{}/{name}", dir(&self.node), self.node.cluster.node_id)
    }
}

impl EventReplica for EtcdEvents {
    fn keep(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        let (mut client, key, value) = (self.node.client.clone(), self.key(name), bytes.to_vec());
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.runtime.spawn(async move {
            let put = tokio::time::timeout(KEEP_TIMEOUT, client.put(key, value, None)).await;
            let _ = tx.send(match put {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("keeping the event in etcd: {e}")),
                Err(_) => Err("keeping the event in etcd: no answer in time".into()),
            });
        });
        let answer = match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| rx.recv_timeout(KEEP_TIMEOUT * 2))
            }
            _ => rx.recv_timeout(KEEP_TIMEOUT * 2),
        };
        answer
            .unwrap_or_else(|_| Err("keeping the event in etcd: no answer".into()))
            .map_err(std::io::Error::other)
    }

    fn forget(&self, name: &str) {
        let (mut client, key) = (self.node.client.clone(), self.key(name));
        self.runtime.spawn(async move {
            if let Err(e) = client.delete(key.as_str(), None).await {
                tracing::warn!("cluster: forgetting event {key} in etcd: {e} (it may run again after a takeover)");
            }
        });
    }
}

/// Before this node's dispatcher starts: its waiting events that another
/// node took over while it was away are dropped here (they run there), and
/// its copies in etcd its disk lost are queued again.
pub async fn reconcile_events(node: &Node, queue: &EventQueue) -> Result<(), String> {
    let mut client = node.client.clone();
    let mine = format!("{}{}/", dir(node), node.cluster.node_id);
    let resp = client
        .get(mine.as_str(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| e.to_string())?;
    let mut in_etcd = HashSet::new();
    for kv in resp.kvs() {
        let Some(name) = kv.key_str().ok().and_then(|k| k.strip_prefix(&mine)) else {
            continue;
        };
        in_etcd.insert(name.to_string());
        if !queue.holds(name) {
            match queue.adopt(name, kv.value()) {
                Ok(()) => tracing::info!("cluster: event {name} kept in etcd queued again"),
                Err(e) => tracing::warn!("cluster: event {name} in etcd is unreadable: {e}"),
            }
        }
    }
    for name in queue.waiting_names() {
        if !in_etcd.contains(&name) && queue.disown(&name) {
            tracing::info!(
                "cluster: event {name} was taken over by another node while this one was away: it runs there"
            );
        }
    }
    Ok(())
}

/// Takes over dead nodes' events every few seconds.
pub fn spawn_takeover(node: Arc<Node>, queue: Arc<EventQueue>) {
    tokio::spawn(async move {
        let mut client = node.client.clone();
        let mut absent_before: HashSet<String> = HashSet::new();
        loop {
            tokio::time::sleep(TAKEOVER_EVERY).await;
            if node.is_fenced() {
                continue;
            }
            match take_over(&mut client, &node, &queue, &absent_before).await {
                Ok(absent) => absent_before = absent,
                Err(e) => tracing::debug!("cluster: looking for a dead node's events: {e}"),
            }
        }
    });
}

/// One pass: claims and queues the events of nodes absent now and in the
/// last pass; returns the nodes absent now.
async fn take_over(
    client: &mut Client,
    node: &Node,
    queue: &EventQueue,
    absent_before: &HashSet<String>,
) -> Result<HashSet<String>, String> {
    let live: HashSet<String> = super::membership::nodes(client, &node.cluster)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|n| n.node_id)
        .collect();
    let events = dir(node);
    let resp = client
        .get(
            events.as_str(),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .map_err(|e| e.to_string())?;
    let mut absent = HashSet::new();
    for kv in resp.kvs() {
        let Some((owner, name)) = kv
            .key_str()
            .ok()
            .and_then(|k| k.strip_prefix(&events))
            .and_then(|rest| rest.split_once('/'))
        else {
            continue;
        };
        if live.contains(owner) || owner == node.cluster.node_id {
            continue;
        }
        absent.insert(owner.to_string());
        if absent_before.contains(owner) {
            claim(client, node, queue, kv.key(), kv.mod_revision(), name).await?;
        }
    }
    Ok(absent)
}

async fn claim(
    client: &mut Client,
    node: &Node,
    queue: &EventQueue,
    key: &[u8],
    revision: i64,
    name: &str,
) -> Result<(), String> {
    let value = client
        .get(key, None)
        .await
        .map_err(|e| e.to_string())?
        .kvs()
        .first()
        .map(|kv| kv.value().to_vec());
    let Some(value) = value else {
        return Ok(()); // ran meanwhile
    };
    let mine = format!("{}{}/{name}", dir(node), node.cluster.node_id);
    let txn = Txn::new()
        .when([Compare::mod_revision(key, CompareOp::Equal, revision)])
        .and_then([
            TxnOp::delete(key, None),
            TxnOp::put(mine.as_str(), value.clone(), None),
        ]);
    if !client
        .txn(txn)
        .await
        .map_err(|e| e.to_string())?
        .succeeded()
    {
        return Ok(()); // another node claimed it first
    }
    match queue.adopt(name, &value) {
        Ok(()) => {
            tracing::info!("cluster: event {name} of a node that is gone taken over: it runs here")
        }
        Err(e) => tracing::warn!("cluster: event {name} taken over but unreadable: {e}"),
    }
    Ok(())
}
