// txnpeer drives txnkeeper with Apache Pulsar's Go client (github.com/apache/pulsar-client-go),
// unmodified: a committed transaction's messages are delivered, an aborted one's never are, and a
// consume-transform-produce step acknowledges its input in the same transaction as its output.
// It prints one JSON line with what it saw and exits 1 when anything differs from what must hold.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
)

type result struct {
	Committed   []string `json:"committed"`
	Aborted     []string `json:"aborted_seen"`
	Transformed []string `json:"transformed"`
	InputLeft   []string `json:"input_redelivered"`
	Errors      []string `json:"errors"`
}

func must(err error, what string) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
		os.Exit(2)
	}
}

func receiveAll(consumer pulsar.Consumer, wait time.Duration) []string {
	var got []string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		msg, err := consumer.Receive(ctx)
		cancel()
		if err != nil {
			return got
		}
		got = append(got, string(msg.Payload()))
		_ = consumer.Ack(msg)
	}
}

func main() {
	url := flag.String("url", "pulsar://127.0.0.1:6650", "service URL")
	prefix := flag.String("topic-prefix", "persistent://public/default/go-txn", "topic name prefix")
	flag.Parse()
	ctx := context.Background()
	client, err := pulsar.NewClient(pulsar.ClientOptions{
		URL: *url, EnableTransaction: true, OperationTimeout: 30 * time.Second,
		Logger: log.NewLoggerWithLogrus(quietLogrus()),
	})
	must(err, "client")
	defer client.Close()

	out, in := *prefix+"-out", *prefix+"-in"
	outConsumer, err := client.Subscribe(pulsar.ConsumerOptions{
		Topic: out, SubscriptionName: "check", SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
	must(err, "subscribe out")
	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: out, DisableBatching: true, SendTimeout: -1})
	must(err, "producer out")
	inProducer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: in, DisableBatching: true})
	must(err, "producer in")
	inConsumer, err := client.Subscribe(pulsar.ConsumerOptions{
		Topic: in, SubscriptionName: "transform", Type: pulsar.Shared,
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
	must(err, "subscribe in")

	res := result{}
	// 1. committed
	txn, err := client.NewTransaction(time.Minute)
	must(err, "begin committed")
	for i := 0; i < 3; i++ {
		_, err = producer.Send(ctx, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("commit-%d", i)), Transaction: txn})
		must(err, "send in committed txn")
	}
	must(txn.Commit(ctx), "commit")
	// 2. aborted
	txn, err = client.NewTransaction(time.Minute)
	must(err, "begin aborted")
	for i := 0; i < 2; i++ {
		_, err = producer.Send(ctx, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("abort-%d", i)), Transaction: txn})
		must(err, "send in aborted txn")
	}
	must(txn.Abort(ctx), "abort")
	// 3. consume-transform-produce
	for i := 0; i < 4; i++ {
		_, err = inProducer.Send(ctx, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("in-%d", i))})
		must(err, "send input")
	}
	for i := 0; i < 4; i++ {
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		msg, err := inConsumer.Receive(rctx)
		cancel()
		must(err, "receive input")
		txn, err = client.NewTransaction(time.Minute)
		must(err, "begin transform")
		_, err = producer.Send(ctx, &pulsar.ProducerMessage{Payload: []byte("t-" + string(msg.Payload())), Transaction: txn})
		must(err, "send transformed")
		must(inConsumer.AckWithTxn(msg, txn), "ack input in txn")
		must(txn.Commit(ctx), "commit transform")
	}
	// One more committed-then-seen marker so the check below knows everything before it was read.
	_, err = producer.Send(ctx, &pulsar.ProducerMessage{Payload: []byte("end")})
	must(err, "send end")

	for _, m := range receiveAll(outConsumer, 5*time.Second) {
		switch {
		case len(m) > 7 && m[:7] == "commit-":
			res.Committed = append(res.Committed, m)
		case len(m) > 6 && m[:6] == "abort-":
			res.Aborted = append(res.Aborted, m)
		case len(m) > 2 && m[:2] == "t-":
			res.Transformed = append(res.Transformed, m)
		}
	}
	inConsumer.Close()
	again, err := client.Subscribe(pulsar.ConsumerOptions{Topic: in, SubscriptionName: "transform", Type: pulsar.Shared})
	must(err, "resubscribe input")
	res.InputLeft = receiveAll(again, 2*time.Second)
	sort.Strings(res.Transformed)

	ok := len(res.Committed) == 3 && len(res.Aborted) == 0 && len(res.Transformed) == 4 && len(res.InputLeft) == 0
	out2, _ := json.Marshal(res)
	fmt.Println(string(out2))
	if !ok {
		os.Exit(1)
	}
}
