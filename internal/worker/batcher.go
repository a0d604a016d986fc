package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"github.com/fleet/fleet/internal/client"
	"github.com/fleet/fleet/internal/wire"
)

// batcher sends the calls of one kind (dispatch, heartbeat, publish,
// fail) that a worker's running jobs make at about the same time as one
// batch call, as a group commit does: a call goes at once when none is in
// flight, and the calls made while one is go together in the next (up to
// wire.MaxBatchItems). Each call gets its item's answer as the single
// call would have given it. A batch call is retried whole, as a single
// call is; every item is safe to repeat (a publication by its operation
// key, a dispatch or a failure under its claim, a heartbeat).
type batcher struct {
	ctx    context.Context // the worker's: a batch outlives any one job's context
	client *Client
	path   string

	mu      sync.Mutex
	queue   []*batchCall
	sending bool
}

type batchCall struct {
	item wire.BatchItem
	done chan batchAnswer // buffered: a caller that gave up is not waited for
}

type batchAnswer struct {
	resp Response
	err  error
}

func newBatcher(ctx context.Context, c *Client, path string) *batcher {
	return &batcher{ctx: ctx, client: c, path: path}
}

// call sends req for job op in the next batch and returns its answer.
func (b *batcher) call(ctx context.Context, op string, req any) (Response, error) {
	payload, err := client.Encode(req)
	if err != nil {
		return Response{}, err
	}
	c := &batchCall{item: wire.BatchItem{OperationID: op, Request: payload}, done: make(chan batchAnswer, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	if !b.sending {
		b.sending = true
		go b.run()
	}
	b.mu.Unlock()
	select {
	case a := <-c.done:
		return a.resp, a.err
	case <-ctx.Done():
		return Response{}, ctx.Err()
	}
}

// run sends what is queued, batch after batch, until nothing is.
func (b *batcher) run() {
	for {
		b.mu.Lock()
		n := min(len(b.queue), wire.MaxBatchItems)
		if n == 0 {
			b.sending = false
			b.mu.Unlock()
			return
		}
		calls := b.queue[:n:n]
		b.queue = b.queue[n:]
		b.mu.Unlock()
		b.send(calls)
	}
}

func (b *batcher) send(calls []*batchCall) {
	items := make([]wire.BatchItem, len(calls))
	for i, c := range calls {
		items[i] = c.item
	}
	resp, err := b.client.Do(b.ctx, http.MethodPost, b.path, wire.BatchRequest{Items: items})
	var res wire.BatchResult
	if err == nil {
		if err = json.Unmarshal(resp.Body, &res); err == nil && len(res.Results) != len(calls) {
			err = fmt.Errorf("%s: %d answers to %d items", b.path, len(res.Results), len(calls))
		}
	}
	for i, c := range calls {
		if err != nil {
			c.done <- batchAnswer{err: err}
			continue
		}
		c.done <- itemAnswer(res.Results[i])
	}
}

// itemAnswer is an item's result as the single call's Do returns it.
func itemAnswer(r wire.ItemResult) batchAnswer {
	if r.Status >= 200 && r.Status < 300 {
		return batchAnswer{resp: Response{Body: r.Body, Replayed: r.Replayed}}
	}
	var e wire.ErrorBody
	_ = json.Unmarshal(r.Body, &e)
	return batchAnswer{err: &client.Error{Status: r.Status, Code: e.Error.Code, Message: e.Error.Message, Body: r.Body}}
}
