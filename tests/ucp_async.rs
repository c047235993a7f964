//! `ucp::tokio` (feature `tokio`): the `ucp_async` example runs, and an `AsyncWorker` sleeps in
//! the runtime between messages instead of spinning, while its requests complete as futures.
//!
//! `cargo test -p rucx --features tokio --test ucp_async` builds the example too.
#![cfg(feature = "tokio")]

use std::cell::{Cell, RefCell};
use std::future::IntoFuture;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ucp::tokio::AsyncWorker;
use ucp::{AmFlags, Context, Features, Issued, Worker};

const DEADLINE: Duration = Duration::from_secs(60);

fn example(name: &str) -> PathBuf {
    rucx_testkit::child::example(name)
}

/// The example on every transport it finds (self, tcp), then on tcp only.
#[test]
fn ucp_async_example() {
    for tls in [None, Some("tcp")] {
        let mut c = Command::new(example("ucp_async"));
        c.arg("5").stdout(Stdio::piped()).stderr(Stdio::piped());
        if let Some(t) = tls {
            c.env("RUCX_TLS", t).env("RUCX_NET_DEVICES", "lo");
        }
        let out = c.output().expect("run ucp_async");
        let (o, e) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(0), "{tls:?}\nstdout:\n{o}\nstderr:\n{e}");
        assert!(o.contains("every echo intact"), "{tls:?}: {o}");
        assert!(o.contains("server: echoed 25 messages"), "{tls:?}: {o}");
    }
}

/// The many-clients example: one server answers 100 concurrent clients, each connected with
/// the awaited `connect_sockaddr` and accepted with `Listener::next_request`, over every
/// transport it finds, then over tcp only.
#[test]
fn ucp_async_server_example_serves_100_clients() {
    for tls in [None, Some("tcp")] {
        let mut c = Command::new(example("ucp_async_server"));
        c.args(["100", "3"]).stdout(Stdio::piped()).stderr(Stdio::piped());
        if let Some(t) = tls {
            c.env("RUCX_TLS", t).env("RUCX_NET_DEVICES", "lo");
        }
        let out = c.output().expect("run ucp_async_server");
        let (o, e) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(0), "{tls:?}\nstdout:\n{o}\nstderr:\n{e}");
        assert!(
            o.contains("clients: all 100 clients answered (300 answers, every one intact)"),
            "{tls:?}: {o}"
        );
        assert!(
            o.contains("server: 100 clients accepted, 300 requests answered"),
            "{tls:?}: {o}"
        );
    }
}

const MESSAGES: usize = 100;
const BURST: usize = 10;
const AM: u16 = 5;
const DONE: u16 = 6;

/// A receiver task sleeps in a current-thread runtime while a sender thread sends bursts of
/// messages with pauses between them: it gets them all with few progress calls (a spinning
/// receiver makes thousands per pause), and its answer completes as an awaited request.
#[test]
fn async_worker_sleeps_between_messages() {
    let ctx = Context::builder(rucx::context_builder().plugins(false).build())
        .features(Features::AM | Features::WAKEUP)
        .config("TLS", "tcp")
        .config("NET_DEVICES", "lo")
        .build()
        .expect("context");
    let (addr_tx, addr_rx) = mpsc::channel::<Vec<u8>>();
    let answered = Arc::new(AtomicBool::new(false));
    let sender = {
        let (ctx, answered) = (ctx.clone(), answered.clone());
        std::thread::spawn(move || {
            let w = Worker::new(&ctx).unwrap();
            let a = answered.clone();
            w.set_am_handler(DONE, move |_| a.store(true, Ordering::Release))
                .unwrap();
            let ep = w.connect(&addr_rx.recv_timeout(DEADLINE).unwrap()).unwrap();
            let start = Instant::now();
            for i in 0..MESSAGES {
                let data = [i as u8; 3000];
                if let Issued::Pending(r) = ep.am_send(AM, &[], &data, AmFlags::REPLY).unwrap() {
                    r.wait(&w).unwrap();
                }
                if i % BURST == BURST - 1 {
                    for _ in 0..100 {
                        w.progress();
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            while !answered.load(Ordering::Acquire) {
                w.progress();
                assert!(start.elapsed() < DEADLINE, "no answer from the receiver");
            }
        })
    };

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    let (calls, slept) = local.block_on(&rt, async {
        let w = Worker::new(&ctx).unwrap();
        let got = Rc::new(RefCell::new(Vec::new()));
        let arrived = Rc::new(tokio::sync::Notify::new());
        let (g, a) = (got.clone(), arrived.clone());
        w.set_am_handler(AM, move |m| {
            g.borrow_mut().push((m.data()[0], m.reply_ep().cloned()));
            a.notify_one();
        })
        .unwrap();
        addr_tx.send(w.address().to_vec()).unwrap();
        let aw = AsyncWorker::new(&w).unwrap();
        let (calls, slept) = (Rc::new(Cell::new(0usize)), Rc::new(Cell::new(0usize)));
        let (c, s) = (calls.clone(), slept.clone());
        // The driver: counts its progress calls, and the ones that found nothing (it slept
        // or yielded after them).
        tokio::task::spawn_local(async move {
            loop {
                c.set(c.get() + 1);
                if aw.progress().await.unwrap() == 0 {
                    s.set(s.get() + 1);
                }
            }
        });
        let all = async {
            while got.borrow().len() < MESSAGES {
                arrived.notified().await;
            }
        };
        if tokio::time::timeout(DEADLINE, all).await.is_err() {
            panic!("only {} of {MESSAGES} messages", got.borrow().len());
        }
        for (i, (b, _)) in got.borrow().iter().enumerate() {
            assert_eq!(*b, i as u8, "message {i}");
        }
        let ep = got.borrow()[0].1.clone().expect("a reply endpoint");
        let answer = ep.am_send(DONE, &[], b"done", AmFlags::default()).unwrap();
        tokio::time::timeout(DEADLINE, answer.into_future())
            .await
            .expect("the answer completes")
            .unwrap();
        (calls.get(), slept.get())
    });
    sender.join().unwrap();
    println!("receiver: {calls} progress calls, {slept} idle, for {MESSAGES} messages");
    assert!(slept > 0);
    assert!(
        calls <= 20 * MESSAGES,
        "{calls} progress calls for {MESSAGES} messages: the receiver spun"
    );
}

/// `AsyncWorker::new` needs `Features::WAKEUP` and a runtime, and says so.
#[test]
fn async_worker_misuse_is_an_error() {
    let ctx = |f| {
        Context::builder(rucx::context_builder().plugins(false).build())
            .features(f)
            .config("TLS", "self")
            .build()
            .expect("context")
    };
    let w = Worker::new(&ctx(Features::AM)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let e = rt.block_on(async { AsyncWorker::new(&w).unwrap_err() });
    assert_eq!(e, ucp::Status::Unsupported, "{e}");
    assert!(e.to_string().contains("Features::WAKEUP"), "{e}");
    let w = Worker::new(&ctx(Features::AM | Features::WAKEUP)).unwrap();
    let e = AsyncWorker::new(&w).unwrap_err();
    assert!(e.to_string().contains("inside a tokio runtime"), "{e}");
}

/// The awaited connect never hangs: a listener whose application never accepts and a TCP
/// listener that never speaks fail it with `TimedOut` after `RUCX_CM_TIMEOUT` (the worker
/// sleeps in the runtime meanwhile: the handshake's timer wakes it), a refused port with
/// `Unreachable`. `next_request` on a listener with a handler is an error, not a wait.
#[test]
fn async_connect_fails_in_time() {
    let ctx = Context::builder(rucx::context_builder().plugins(false).build())
        .features(Features::AM | Features::WAKEUP)
        .config("TLS", "tcp")
        .config("NET_DEVICES", "lo")
        .config("CM_TIMEOUT", "300ms")
        .build()
        .expect("context");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let server = Worker::new(&ctx).unwrap();
        let client = Worker::new(&ctx).unwrap();
        for w in [&server, &client] {
            let aw = AsyncWorker::new(w).unwrap();
            tokio::task::spawn_local(async move { aw.run().await });
        }
        let aw = AsyncWorker::new(&client).unwrap();
        let l = server
            .listen("127.0.0.1:0".parse().unwrap(), ucp::ListenerParams::new())
            .unwrap();
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let absent = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        for (to, want) in [
            (l.local_addr(), ucp::Status::TimedOut),
            (silent.local_addr().unwrap(), ucp::Status::TimedOut),
            (absent, ucp::Status::Unreachable),
        ] {
            let start = Instant::now();
            let r = tokio::time::timeout(DEADLINE, aw.connect_sockaddr(to, ucp::EpParams::new()))
                .await
                .unwrap_or_else(|_| panic!("connect to {to} still pending after {DEADLINE:?}"));
            let e = r.expect_err("connected to a server that never accepts");
            assert_eq!(e.status(), want, "{to}: {e}");
            if want == ucp::Status::TimedOut {
                assert!(start.elapsed() >= Duration::from_millis(300), "{e}");
                assert!(e.to_string().contains("RUCX_CM_TIMEOUT"), "{e}");
            }
        }
        // The request the application never accepted.
        let req = l.next_request().await.unwrap();
        assert_eq!(req.client_id(), client.id());
        let with_handler = server
            .listen(
                "127.0.0.1:0".parse().unwrap(),
                ucp::ListenerParams::new().on_conn_request(drop),
            )
            .unwrap();
        let e = with_handler.next_request().await.unwrap_err();
        assert_eq!(e.status(), ucp::Status::InvalidParam, "{e}");
    });
}

/// `am_stream` yields every message of its id in order, owned, eager and rendezvous alike,
/// with the reply endpoint; dropping the stream removes its handler.
#[test]
fn am_stream_yields_every_size_in_order() {
    let ctx = Context::builder(rucx::context_builder().plugins(false).build())
        .features(Features::AM | Features::WAKEUP)
        .config("TLS", "tcp")
        .config("NET_DEVICES", "lo")
        .build()
        .expect("context");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let a = Worker::new(&ctx).unwrap();
        let b = Worker::new(&ctx).unwrap();
        for w in [&a, &b] {
            let aw = AsyncWorker::new(w).unwrap();
            tokio::task::spawn_local(async move { aw.run().await });
        }
        let mut stream = b.am_stream(9).unwrap();
        let ep = a.connect(b.address()).unwrap();
        let sizes = [0usize, 8, 5000, 70_000, 1 << 20];
        let mut sends = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..n).map(|k| (k + i) as u8).collect();
            sends.push(ep.am_send_owned(9, &[i as u8], data, AmFlags::REPLY).unwrap());
        }
        for s in sends {
            tokio::time::timeout(DEADLINE, s.into_future())
                .await
                .unwrap()
                .unwrap();
        }
        for (i, &n) in sizes.iter().enumerate() {
            let m = tokio::time::timeout(DEADLINE, stream.recv())
                .await
                .expect("a message")
                .unwrap();
            assert_eq!(m.header, [i as u8]);
            assert_eq!(m.data.len(), n, "message {i}");
            assert!(m.data.iter().enumerate().all(|(k, &v)| v == (k + i) as u8));
            assert_eq!(m.reply_ep.expect("a reply endpoint").remote_id(), a.id());
        }
        assert!(stream.try_recv().is_none());
        drop(stream);
        let got = Rc::new(Cell::new(0));
        let g = got.clone();
        // The id is free again: a handler set now gets the next message.
        b.set_am_handler(9, move |_| g.set(g.get() + 1)).unwrap();
        ep.am_send(9, &[], b"x", AmFlags::default())
            .unwrap()
            .into_future()
            .await
            .unwrap();
        tokio::time::timeout(DEADLINE, async {
            while got.get() == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the handler ran");
    });
}
