// TxnPeer drives txnkeeper with Apache Pulsar's Java client (org.apache.pulsar:pulsar-client),
// unmodified. Modes:
//   basic URL            subscription types with batching off and on, Key_Shared (each key on one
//                        consumer, in order), cumulative acks, redelivery after a negative ack and
//                        after the ack timeout
//   txn URL PREFIX N [batched]
//                        fills PREFIX-in with N messages, then consumes, transforms and produces each
//                        into PREFIX-out inside a transaction (ack and send in it, commit); failed
//                        transactions are aborted and the input comes back. Prints "committed K" as it
//                        goes (the test kills pods meanwhile), then reads PREFIX-out from the start.
//                        "batched": the input is written in producer batches of 10, each transaction
//                        takes up to 3 messages (acknowledged by batch index, as the client does for
//                        a batch's message in a transaction), and every 5th one is aborted on purpose
//                        after its acks and sends, so batches come back partly acknowledged.
//   dedup URL TOPIC N    a named producer (batching off, no send timeout) sends N messages, printing
//                        "sent K" as it goes (the test kills the store meanwhile: the client resends
//                        what had no receipt), then reads TOPIC from the start: on a store with
//                        deduplication each message must be there exactly once.
// Each mode prints one JSON line last and exits 1 when what must hold did not.
import java.util.*;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.*;
import org.apache.pulsar.client.api.transaction.Transaction;

public class TxnPeer {
    static final List<String> failures = new ArrayList<>();

    static void check(boolean ok, String what) {
        if (!ok) failures.add(what);
    }

    static List<String> drain(Consumer<byte[]> consumer, int count, boolean ack) throws Exception {
        List<String> got = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            Message<byte[]> m = consumer.receive(15, TimeUnit.SECONDS);
            if (m == null) break;
            got.add(new String(m.getValue()));
            if (ack) consumer.acknowledge(m);
        }
        return got;
    }

    static boolean quiet(Consumer<byte[]> consumer, int ms) throws Exception {
        Message<byte[]> m = consumer.receive(ms, TimeUnit.MILLISECONDS);
        return m == null;
    }

    static List<String> expected(String prefix, int n) {
        List<String> all = new ArrayList<>();
        for (int i = 0; i < n; i++) all.add(prefix + i);
        return all;
    }

    static void basic(PulsarClient client) throws Exception {
        String base = "persistent://public/default/java-basic-" + System.nanoTime();
        for (SubscriptionType type : new SubscriptionType[] {
                SubscriptionType.Exclusive, SubscriptionType.Shared, SubscriptionType.Failover}) {
            for (boolean batching : new boolean[] {false, true}) {
                String topic = base + "-" + type + "-" + batching;
                Consumer<byte[]> consumer = client.newConsumer().topic(topic).subscriptionName("s")
                        .subscriptionType(type).subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                        .subscribe();
                Producer<byte[]> producer = client.newProducer().topic(topic).enableBatching(batching)
                        .batchingMaxMessages(10).batchingMaxPublishDelay(5, TimeUnit.MILLISECONDS).create();
                for (int i = 0; i < 50; i++) producer.sendAsync(("m" + i).getBytes());
                producer.flush();
                List<String> got = drain(consumer, 50, true);
                check(got.equals(expected("m", 50)), type + " batching=" + batching + " got " + got);
                check(quiet(consumer, 300), type + " batching=" + batching + " more than sent");
                producer.close();
                consumer.close();
            }
        }
        // Key_Shared: each key on one consumer, in order
        String ks = base + "-ks";
        Consumer<byte[]> k1 = client.newConsumer().topic(ks).subscriptionName("k").receiverQueueSize(10)
                .subscriptionType(SubscriptionType.Key_Shared).subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .subscribe();
        Consumer<byte[]> k2 = client.newConsumer().topic(ks).subscriptionName("k").receiverQueueSize(10)
                .subscriptionType(SubscriptionType.Key_Shared).subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .subscribe();
        Producer<byte[]> kp = client.newProducer().topic(ks).enableBatching(false).create();
        for (int i = 0; i < 60; i++) kp.newMessage().key("key-" + (i % 6)).value((i % 6 + ":" + i).getBytes()).send();
        Map<String, List<Integer>> seenBy1 = new TreeMap<>(), seenBy2 = new TreeMap<>();
        int total = 0;
        for (int round = 0; round < 200 && total < 60; round++) {
            for (int c = 0; c < 2; c++) {
                Consumer<byte[]> kc = c == 0 ? k1 : k2;
                Message<byte[]> m = kc.receive(50, TimeUnit.MILLISECONDS);
                if (m == null) continue;
                String[] parts = new String(m.getValue()).split(":");
                (c == 0 ? seenBy1 : seenBy2).computeIfAbsent(parts[0], x -> new ArrayList<>()).add(Integer.parseInt(parts[1]));
                kc.acknowledge(m);
                total++;
            }
        }
        check(total == 60, "Key_Shared delivered " + total + " of 60");
        for (String key : seenBy1.keySet()) check(!seenBy2.containsKey(key), "key " + key + " went to both consumers");
        for (Map<String, List<Integer>> seen : List.of(seenBy1, seenBy2))
            for (Map.Entry<String, List<Integer>> e : seen.entrySet()) {
                List<Integer> sorted = new ArrayList<>(e.getValue());
                Collections.sort(sorted);
                check(sorted.equals(e.getValue()), "key " + e.getKey() + " out of order " + e.getValue());
            }
        k1.close();
        k2.close();
        // cumulative ack: nothing up to the acked message comes back
        String topic = base + "-cumulative";
        Producer<byte[]> producer = client.newProducer().topic(topic).enableBatching(false).create();
        Consumer<byte[]> consumer = client.newConsumer().topic(topic).subscriptionName("c")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe();
        for (int i = 0; i < 10; i++) producer.send(("c" + i).getBytes());
        Message<byte[]> last = null;
        for (int i = 0; i < 6; i++) last = consumer.receive(15, TimeUnit.SECONDS);
        consumer.acknowledgeCumulative(last);
        consumer.close();
        consumer = client.newConsumer().topic(topic).subscriptionName("c").subscribe();
        List<String> rest = drain(consumer, 4, true);
        check(rest.equals(List.of("c6", "c7", "c8", "c9")), "after a cumulative ack of c5 got " + rest);
        consumer.close();
        // negative ack, then the ack timeout: the message comes back, counted
        topic = base + "-redeliver";
        producer = client.newProducer().topic(topic).enableBatching(false).create();
        consumer = client.newConsumer().topic(topic).subscriptionName("r").subscriptionType(SubscriptionType.Shared)
                .negativeAckRedeliveryDelay(100, TimeUnit.MILLISECONDS).ackTimeout(1, TimeUnit.SECONDS)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe();
        producer.send("again".getBytes());
        Message<byte[]> first = consumer.receive(15, TimeUnit.SECONDS);
        consumer.negativeAcknowledge(first);
        Message<byte[]> second = consumer.receive(15, TimeUnit.SECONDS);
        check(second != null && second.getMessageId().equals(first.getMessageId()) && second.getRedeliveryCount() >= 1,
                "negative ack did not redeliver");
        Message<byte[]> third = consumer.receive(15, TimeUnit.SECONDS);  // not acked: the ack timeout
        check(third != null && third.getMessageId().equals(first.getMessageId()), "ack timeout did not redeliver");
        consumer.acknowledge(third);
        check(quiet(consumer, 2500), "redelivered after the ack");
        System.out.println("{\"mode\": \"basic\", \"failures\": " + json(failures) + "}");
    }

    static void txn(PulsarClient client, String prefix, int n, boolean batched) throws Exception {
        String in = prefix + "-in", out = prefix + "-out";
        Consumer<byte[]> verify = client.newConsumer().topic(out).subscriptionName("verify")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe();
        Consumer<byte[]> input = client.newConsumer().topic(in).subscriptionName("transform")
                .subscriptionType(SubscriptionType.Shared).receiverQueueSize(20)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe();
        Producer<byte[]> filler = client.newProducer().topic(in).enableBatching(batched)
                .batchingMaxMessages(10).batchingMaxPublishDelay(50, TimeUnit.MILLISECONDS).create();
        for (int i = 0; i < n; i++) filler.sendAsync(("in-" + i).getBytes());
        filler.flush();
        Producer<byte[]> output = client.newProducer().topic(out).enableBatching(false)
                .sendTimeout(0, TimeUnit.SECONDS).create();
        int committed = 0, aborted = 0, failedCommits = 0, abortedOnPurpose = 0, attempts = 0;
        long deadline = System.currentTimeMillis() + 240_000;
        Set<String> done = new HashSet<>();
        while (done.size() < n && System.currentTimeMillis() < deadline) {
            List<Message<byte[]>> taken = new ArrayList<>();
            try {
                Message<byte[]> m = input.receive(5, TimeUnit.SECONDS);
                if (m != null) taken.add(m);
                while (batched && m != null && taken.size() < 3) {
                    m = input.receive(20, TimeUnit.MILLISECONDS);
                    if (m != null) taken.add(m);
                }
            } catch (PulsarClientException e) {
                continue;
            }
            if (taken.isEmpty()) continue;
            Transaction txn = null;
            boolean onPurpose = batched && ++attempts % 5 == 0;
            try {
                txn = client.newTransaction().withTransactionTimeout(30, TimeUnit.SECONDS).build().get(20, TimeUnit.SECONDS);
                for (Message<byte[]> m : taken) {
                    output.newMessage(txn).value(("t-" + new String(m.getValue())).getBytes()).send();
                    input.acknowledgeAsync(m.getMessageId(), txn).get(20, TimeUnit.SECONDS);
                }
                if (onPurpose) throw new IllegalStateException("aborted on purpose");
                txn.commit().get(30, TimeUnit.SECONDS);
                for (Message<byte[]> m : taken) {
                    committed++;
                    done.add(new String(m.getValue()));
                    System.out.println("committed " + committed);
                }
            } catch (Exception e) {
                failedCommits++;
                if (onPurpose) abortedOnPurpose++;
                if (txn != null) {
                    try {
                        txn.abort().get(30, TimeUnit.SECONDS);
                        aborted++;
                    } catch (Exception ignored) {
                        // ended by its coordinator (timeout) or already decided: the store learns the outcome
                    }
                }
                for (Message<byte[]> m : taken) input.negativeAcknowledge(m);
            }
        }
        List<String> seen = new ArrayList<>();
        while (true) {
            Message<byte[]> m = verify.receive(5, TimeUnit.SECONDS);
            if (m == null) break;
            seen.add(new String(m.getValue()));
            verify.acknowledge(m);
        }
        Map<String, Integer> counts = new TreeMap<>();
        for (String s : seen) counts.merge(s, 1, Integer::sum);
        List<String> duplicated = new ArrayList<>(), missing = new ArrayList<>();
        for (Map.Entry<String, Integer> e : counts.entrySet()) if (e.getValue() > 1) duplicated.add(e.getKey());
        for (int i = 0; i < n; i++) if (!counts.containsKey("t-in-" + i)) missing.add("t-in-" + i);
        check(duplicated.isEmpty(), "duplicated outputs " + duplicated);
        check(missing.isEmpty(), "missing outputs " + missing);
        System.out.println("{\"mode\": \"txn\", \"committed\": " + committed + ", \"aborted\": " + aborted
                + ", \"aborted_on_purpose\": " + abortedOnPurpose
                + ", \"failed_attempts\": " + failedCommits + ", \"outputs\": " + seen.size()
                + ", \"failures\": " + json(failures) + "}");
    }

    static String json(List<String> items) {
        StringBuilder b = new StringBuilder("[");
        for (int i = 0; i < items.size(); i++) {
            if (i > 0) b.append(", ");
            b.append('"').append(items.get(i).replace("\\", "\\\\").replace("\"", "'")).append('"');
        }
        return b.append(']').toString();
    }

    static void dedup(PulsarClient client, String topic, int n) throws Exception {
        Consumer<byte[]> audit = client.newConsumer().topic(topic).subscriptionName("audit")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe();
        Producer<byte[]> producer = client.newProducer().topic(topic).producerName("java-dedup")
                .enableBatching(false).sendTimeout(0, TimeUnit.SECONDS).blockIfQueueFull(true).create();
        List<java.util.concurrent.CompletableFuture<MessageId>> sends = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            sends.add(producer.sendAsync(("d" + i).getBytes()));
            if (i % 100 == 99) {
                System.out.println("sent " + (i + 1));
                Thread.sleep(20); // leave the test a moment to kill the store with sends in flight
            }
        }
        int failed = 0;
        for (java.util.concurrent.CompletableFuture<MessageId> send : sends) {
            try {
                send.get(180, TimeUnit.SECONDS);
            } catch (Exception e) {
                failed++;
            }
        }
        check(failed == 0, failed + " sends failed");
        List<String> got = drain(audit, n + 100, true);
        Set<String> distinct = new HashSet<>(got);
        check(got.size() == distinct.size(), (got.size() - distinct.size()) + " messages were written twice");
        check(distinct.equals(new HashSet<>(expected("d", n))), "received " + distinct.size() + " of " + n);
        System.out.println("{\"failures\": " + json(failures) + ", \"received\": " + got.size()
                + ", \"distinct\": " + distinct.size() + "}");
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0], url = args[1];
        PulsarClient client = PulsarClient.builder().serviceUrl(url).enableTransaction(mode.equals("txn"))
                .operationTimeout(30, TimeUnit.SECONDS).build();
        try {
            if (mode.equals("basic")) basic(client);
            else if (mode.equals("dedup")) dedup(client, args[2], Integer.parseInt(args[3]));
            else txn(client, args[2], Integer.parseInt(args[3]), args.length > 4 && args[4].equals("batched"));
        } finally {
            client.close();
        }
        System.exit(failures.isEmpty() ? 0 : 1);
    }
}
