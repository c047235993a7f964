//! A transport on a device, opened the same way for every entity and pair of a test: its
//! resource, how endpoints connect, whether the two sides of a pair share a worker, the
//! configuration every interface gets (set in code), and how long waits may take.

use std::time::Duration;

use uct::{Iface, IfaceParams, Md, Worker};

use crate::device::Resource;
use crate::entity::{self, Entity};
use crate::pair::{Connect, Pair, Workers};
use crate::wait::DEADLINE;

#[derive(Clone)]
pub struct Setup {
    name: &'static str,
    res: Resource,
    connect: Connect,
    workers: Workers,
    config: Vec<(String, String)>,
    deadline: Duration,
}

impl Setup {
    /// `res` under the name `name` (in messages and skip notes), connecting to interfaces with
    /// a worker per side, waits bounded by [`DEADLINE`].
    pub fn new(name: &'static str, res: Resource) -> Setup {
        Setup {
            name,
            res,
            connect: Connect::ToIface,
            workers: Workers::Separate,
            config: Vec::new(),
            deadline: DEADLINE,
        }
    }

    /// The connection model and worker layout of the pairs it makes.
    pub fn layout(mut self, connect: Connect, workers: Workers) -> Setup {
        self.connect = connect;
        self.workers = workers;
        self
    }

    /// Sets configuration variable `name` (`TCP_SNDBUF`, with or without `RUCX_`) in code for
    /// every interface it opens.
    pub fn config(mut self, name: &str, value: &str) -> Setup {
        self.config.push((name.to_owned(), value.to_owned()));
        self
    }

    /// How long the waits of its pairs may take.
    pub fn deadline(mut self, d: Duration) -> Setup {
        self.deadline = d;
        self
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn tl(&self) -> &str {
        &self.res.tl
    }

    pub fn dev(&self) -> &str {
        &self.res.dev
    }

    pub fn resource(&self) -> &Resource {
        &self.res
    }

    /// Prints why (part of) a test does not run here.
    pub fn skip(&self, what: &str) {
        println!("SKIP [{}] {what}", self.name);
    }

    /// A new memory domain of the transport's component.
    pub fn md_open(&self) -> Md {
        self.res.md_open()
    }

    /// A new worker (poll mode).
    pub fn worker(&self) -> Worker {
        entity::worker()
    }

    /// The interface parameters: the transport and device, with the configuration.
    /// Interfaces are opened for wakeup (an event fd where the transport has one), so the
    /// event tests see what a sleeping application gets.
    pub fn params(&self) -> IfaceParams {
        self.config.iter().fold(
            IfaceParams::new(self.tl(), self.dev()).wakeup(true),
            |p, (k, v)| p.config(k, v),
        )
    }

    /// Opens an interface on `md` and `worker` with the parameters `params` makes of
    /// [`Setup::params`].
    pub fn open_iface(
        &self,
        md: &Md,
        worker: &Worker,
        params: impl FnOnce(IfaceParams) -> IfaceParams,
    ) -> uct::Result<Iface> {
        let _alone = entity::opening();
        Iface::open(md, worker, params(self.params()))
    }

    /// An entity on `worker`: its own memory domain, an interface with progress enabled (by
    /// default).
    pub fn entity(&self, worker: &Worker) -> Entity {
        self.entity_with(worker, |p| p)
    }

    /// [`Setup::entity`] with the parameters `params` makes of [`Setup::params`].
    pub fn entity_with(&self, worker: &Worker, params: impl FnOnce(IfaceParams) -> IfaceParams) -> Entity {
        Entity::open(&self.md_open(), worker, params(self.params()))
            .unwrap_or_else(|e| panic!("[{}] Iface::open: {e}", self.name))
    }

    /// A connected sender → receiver pair.
    pub fn pair(&self) -> Pair {
        self.pair_with(|p| p, |p| p)
    }

    /// [`Setup::pair`] with the sender's and the receiver's interface parameters made by `tx`
    /// and `rx`.
    pub fn pair_with(
        &self,
        tx: impl FnOnce(IfaceParams) -> IfaceParams,
        rx: impl FnOnce(IfaceParams) -> IfaceParams,
    ) -> Pair {
        let w1 = self.worker();
        let w2 = match self.workers {
            Workers::Shared => w1.clone(),
            Workers::Separate => self.worker(),
        };
        let tx = self.entity_with(&w1, tx);
        let rx = self.entity_with(&w2, rx);
        Pair::new(self.name, tx, rx, self.connect, self.workers, self.deadline)
    }
}
