//! The client side: [`crate::Worker::connect_sockaddr`] and
//! [`crate::Worker::connect_sockaddr_nb`] (neither blocks), and the deadline both share:
//! each client endpoint is watched until it is connected, failed, or `RUCX_CM_TIMEOUT` past
//! the call.

use super::*;

/// A non-blocking connect before its endpoint exists.
pub(super) struct Start {
    pub params: EpParams,
    pub done: Completer<Ep>,
    pub deadline: Instant,
}

/// A client endpoint, watched until it is connected, failed, or past its deadline.
pub(super) struct Watch {
    ep: Weak<EpInner>,
    to: SocketAddr,
    /// `connect_sockaddr_nb`: the endpoint (its request owns it until then) and the request.
    done: Option<(Rc<EpInner>, Completer<Ep>)>,
    deadline: Instant,
    /// A server's accepted endpoint (not a client's), for the message.
    accepted: bool,
}

impl Cm {
    /// Completes the watched endpoints that are connected or failed; fails those past their
    /// deadline.
    pub(super) fn check_watches(&self, now: Instant) -> u32 {
        let watches = std::mem::take(&mut *self.watches.borrow_mut());
        let mut keep = Vec::with_capacity(watches.len());
        let mut n = 0;
        for wt in watches {
            let Some(ep) = wt.ep.upgrade() else {
                continue;
            };
            if wt.accepted {
                // Waiting for the client's wireup REQUEST while the endpoint is still in the
                // worker's table of endpoints to pair (its lanes may be usable already).
                let waiting = !matches!(ep.wired.get(), Wired::Failed(_) | Wired::Closed)
                    && self.worker.upgrade().is_some_and(|w| {
                        w.eps
                            .borrow()
                            .unmatched
                            .contains_key(&(ep.remote.uuid, ep.conn_sn))
                    });
                if waiting && now < wt.deadline {
                    keep.push(wt);
                } else if waiting {
                    n += 1;
                    ep.fail(Error::new(
                        Status::TimedOut,
                        format!(
                            "ucp: accepted client {}: no wireup from it within {:?} of the \
                             accept (RUCX_CM_TIMEOUT)",
                            wt.to, self.timeout
                        ),
                    ));
                }
                continue;
            }
            if ep.wired.get() == Wired::WaitingForPeer && now >= wt.deadline {
                ep.fail(Error::new(
                    Status::TimedOut,
                    format!(
                        "ucp: connect to {}: not connected within {:?} (RUCX_CM_TIMEOUT): the \
                         server did not accept the connection request, or the wireup after it \
                         did not finish",
                        wt.to, self.timeout
                    ),
                ));
            }
            let r = match ep.wired.get() {
                Wired::WaitingForPeer => {
                    keep.push(wt);
                    continue;
                }
                Wired::Ready => Ok(Ep::from_inner(ep)),
                Wired::Failed(_) | Wired::Closed => Err(ep.error()),
            };
            n += 1;
            if let Some((_, c)) = wt.done {
                c.complete(r);
            }
        }
        self.watches.borrow_mut().extend(keep);
        n
    }

    /// Starts the deadline tick while a client handshake runs; stops it after.
    pub(super) fn update_tick(&self) {
        let busy =
            !self.watches.borrow().is_empty() || self.conns.borrow().iter().any(|c| !incoming_side(&c.side));
        match (busy, self.tick.get()) {
            (true, None) => {
                let any = self.any.clone();
                let every = (self.timeout / 10).clamp(Duration::from_millis(1), Duration::from_millis(100));
                match self
                    .actx
                    .add_timer(every, move || any.store(true, Ordering::Release))
                {
                    Ok(id) => self.tick.set(Some(id)),
                    Err(e) => ucs::warn!(
                        "ucp: connection manager: no timer ({e}): handshake deadlines are checked \
                         only when something else happens"
                    ),
                }
            }
            (false, Some(id)) => {
                self.tick.set(None);
                let _ = self.actx.remove_handler(id, false);
            }
            _ => {}
        }
    }

    /// Watches a client endpoint until it is connected (`done` completes then).
    pub(super) fn watch(
        &self,
        ep: &Rc<EpInner>,
        to: SocketAddr,
        done: Option<Completer<Ep>>,
        deadline: Instant,
    ) {
        self.watches.borrow_mut().push(Watch {
            ep: Rc::downgrade(ep),
            to,
            done: done.map(|c| (ep.clone(), c)),
            deadline,
            accepted: false,
        });
        self.any.store(true, Ordering::Release);
    }

    /// Watches a server endpoint just accepted from client `from`: failed with `TimedOut` if
    /// the client's wireup does not finish within `RUCX_CM_TIMEOUT` (a client that is accepted
    /// and goes silent holds nothing for ever, whatever its error mode).
    pub(super) fn watch_accepted(&self, ep: &Rc<EpInner>, from: SocketAddr) {
        self.watches.borrow_mut().push(Watch {
            ep: Rc::downgrade(ep),
            to: from,
            done: None,
            deadline: Instant::now() + self.timeout,
            accepted: true,
        });
        self.any.store(true, Ordering::Release);
    }
}

impl Cm {
    /// The client's endpoint toward the server `remote` announced, its connection id, and the
    /// REQUEST to send. Its sends wait for the server's ACCEPT and the wireup after it.
    pub(super) fn client_ep(
        &self,
        w: &Rc<WorkerInner>,
        remote: WorkerAddress,
        params: EpParams,
    ) -> Result<(Rc<EpInner>, u64, Vec<u8>)> {
        let conn_id = self.next_conn.get();
        self.next_conn.set(conn_id + 1);
        let ep = crate::ep::create(w, remote, conn_id | CONN_SN_BIT, None, params.err_mode)?;
        *ep.err_handler.borrow_mut() = params.on_error;
        ep.wired.set(Wired::WaitingForPeer);
        let req = Msg {
            kind: Kind::Request,
            flags: if params.err_mode == ErrMode::Peer {
                FLAG_ERR_PEER
            } else {
                0
            },
            worker: w.uuid,
            conn_id,
            ep: ep.id.get(),
            address: w.address.clone(),
        };
        Ok((ep, conn_id, req.encode()))
    }
}

/// The server's address from its ANNOUNCE.
pub(super) fn announced(to: SocketAddr, announce: &Msg) -> Result<WorkerAddress> {
    let bad = |why: String| Error::new(Status::InvalidParam, format!("ucp: connect to {to}: {why}"));
    if announce.kind != Kind::Announce {
        return Err(bad(format!(
            "{:?} where the server's address was due",
            announce.kind
        )));
    }
    let remote = WorkerAddress::unpack(&announce.address)
        .map_err(|e| e.context_with(format_args!("ucp: connect to {to}: the server's address")))?;
    if remote.uuid != announce.worker {
        return Err(bad(format!(
            "worker {:#x} announced the address of worker {:#x}",
            announce.worker, remote.uuid
        )));
    }
    Ok(remote)
}

/// Writes what the non-blocking socket takes now of `bytes` (normally all: a few kilobytes
/// into a fresh connection); returns how many. The rest waits for the socket to be writable.
pub(super) fn write_some(s: &TcpStream, to: SocketAddr, bytes: &[u8]) -> Result<usize> {
    let mut s = s;
    let mut off = 0;
    while off < bytes.len() {
        match s.write(&bytes[off..]) {
            Ok(0) => return Err(io_error(to, "connect to", &ErrorKind::WriteZero.into())),
            Ok(n) => off += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => return Err(io_error(to, "connect to", &e)),
        }
    }
    Ok(off)
}

/// Whether a connecting socket has connected (an error if it was refused).
pub(super) fn tcp_connected(s: &Watched<TcpStream>, to: SocketAddr) -> Result<bool> {
    match s.sock.take_error() {
        Ok(Some(e)) | Err(e) => return Err(io_error(to, "connect to", &e)),
        Ok(None) => {}
    }
    match s.sock.peer_addr() {
        Ok(_) => {
            let _ = s.sock.set_nodelay(true);
            s.set_interest(Events::READ)?;
            Ok(true)
        }
        Err(e) if e.kind() == ErrorKind::NotConnected => Ok(false),
        Err(e) => Err(io_error(to, "connect to", &e)),
    }
}

/// `timeout` from now (a year from now for a timeout beyond what `Instant` holds).
pub(super) fn deadline_in(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 86400)))
        .unwrap_or(now)
}

/// [`Worker::connect_sockaddr`]: [`connect_nb`] under a handle that keeps the operations
/// issued before the endpoint exists.
pub(super) fn connect(w: &Rc<WorkerInner>, to: SocketAddr, mut params: EpParams) -> Result<Ep> {
    let on_error = params.on_error.take();
    let err_mode = params.err_mode;
    let req = connect_nb(w, to, params)?;
    Ok(crate::ep::connecting_handle(w, to, err_mode, on_error, req))
}

/// [`Worker::connect_sockaddr_nb`].
pub(super) fn connect_nb(w: &Rc<WorkerInner>, to: SocketAddr, params: EpParams) -> Result<Request<Ep>> {
    let s = sock::connect_nonblocking(to)?;
    let cm = cm(w);
    let (req, done) = request_on(w);
    let start = Box::new(Start {
        params,
        done,
        deadline: deadline_in(cm.timeout),
    });
    cm.try_add_conn(
        s,
        to,
        Side::Starting {
            start,
            connected: false,
        },
    )?;
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_in_never_overflows() {
        let now = Instant::now();
        assert!(deadline_in(Duration::MAX) > now);
        let d = deadline_in(Duration::from_secs(10));
        assert!(d >= now + Duration::from_secs(10));
    }
}
