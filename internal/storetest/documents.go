package storetest

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

func testDocumentInsertGet(t *testing.T, s *suite) {
	f := s.setup(t)
	f.refused("one document id twice", func(ctx context.Context, tx *store.Tx) error { return tx.DocumentInsert(ctx, "doc-1", 2) })
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.DocumentInsert(ctx, "doc-new", 5); err != nil {
			return err
		}
		for _, lock := range []store.Lock{store.NoLock, store.ForUpdate} {
			if d := must(tx.DocumentGet(ctx, "doc-new", lock)); d.ID != "doc-new" || d.Version != 0 || d.Generation != 0 || d.Owner != "" || string(d.Body) != "null" {
				t.Fatalf("a new document (%v): %+v", lock, d)
			}
		}
		if _, err := tx.DocumentGet(ctx, "nope", store.NoLock); !store.IsNotFound(err) {
			t.Fatalf("an absent document: %v", err)
		}
		return nil
	})
}

func testDocumentInsertMany(t *testing.T, s *suite) {
	// Every document of the list, each as DocumentInsert makes it; one id
	// that exists refuses them all; none is nothing.
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.DocumentInsertMany(ctx, []string{"doc-a", "doc-b", "doc-c"}, 7); err != nil {
			return err
		}
		for _, id := range []string{"doc-a", "doc-b", "doc-c"} {
			if d := must(tx.DocumentGet(ctx, id, store.NoLock)); d.ID != id || d.Version != 0 || d.Generation != 0 || d.Owner != "" || string(d.Body) != "null" {
				t.Fatalf("%s: %+v", id, d)
			}
		}
		return tx.DocumentInsertMany(ctx, []string{}, 7)
	})
	f.refused("a list holding a document that exists", func(ctx context.Context, tx *store.Tx) error {
		return tx.DocumentInsertMany(ctx, []string{"doc-d", "doc-1"}, 8)
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		if _, err := tx.DocumentGet(ctx, "doc-d", store.NoLock); !store.IsNotFound(err) {
			t.Fatalf("a refused list left doc-d: %v", err)
		}
		return nil
	})
}

func testDocumentAssign(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		zero, stale := int64(0), int64(5)
		if a := must(tx.DocumentAssign(ctx, &store.DocumentAssignParams{ID: "doc-1", IfGeneration: &zero, Owner: "w1", Reason: "operator", AtMS: 9})); !a.OK || a.Generation != 1 {
			t.Fatalf("compare-and-swap at 0: %+v", a)
		}
		if a := must(tx.DocumentAssign(ctx, &store.DocumentAssignParams{ID: "doc-1", IfGeneration: &stale, Owner: "w2", Reason: "operator", AtMS: 9})); a.OK {
			t.Fatalf("a stale expectation matched: %+v", a)
		}
		if a := must(tx.DocumentAssign(ctx, &store.DocumentAssignParams{ID: "doc-1", Owner: "", Reason: "revoked", AtMS: 10})); !a.OK || a.Generation != 2 {
			t.Fatalf("revoke: %+v", a)
		}
		if a := must(tx.DocumentAssign(ctx, &store.DocumentAssignParams{ID: "nope", Owner: "", Reason: "x", AtMS: 9})); a.OK {
			t.Fatalf("an absent document matched: %+v", a)
		}
		d := must(tx.DocumentGet(ctx, "doc-1", store.ForUpdate))
		j := must(tx.JobGet(ctx, "op-1", store.NoLock))
		if d.Generation != 2 || d.Owner != "" || j.Generation != 2 || j.Owner != "" {
			t.Fatalf("document %+v, job sees generation %d", d, j.Generation)
		}
		return nil
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		want := []store.Assignment{{DocumentID: "doc-1", Generation: 1, Owner: "w1", Reason: "operator", AtMS: 9},
			{DocumentID: "doc-1", Generation: 2, Owner: "", Reason: "revoked", AtMS: 10}}
		if got := must(tx.AssignmentList(ctx, "doc-1")); !reflect.DeepEqual(got, want) {
			t.Fatalf("assignments %+v", got)
		}
		return nil
	})
}

func testDocumentWrite(t *testing.T, s *suite) {
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.DocumentWrite(ctx, &store.DocumentWriteParams{ID: "doc-1", Body: []byte(`{"a":1}`), Version: 1, AtMS: 9})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		d := must(tx.DocumentGet(ctx, "doc-1", store.NoLock))
		j := must(tx.JobGet(ctx, "op-1", store.NoLock))
		if string(d.Body) != `{"a":1}` || d.Version != 1 || j.DocumentVersion != 1 {
			t.Fatalf("document %+v; the job reads version %d", d, j.DocumentVersion)
		}
		if other := must(tx.DocumentGet(ctx, "doc-2", store.NoLock)); other.Version != 0 {
			t.Fatalf("another document changed: %+v", other)
		}
		return nil
	})
}

func testDocumentWriteMany(t *testing.T, s *suite) {
	// Several documents written in one call, each as it would be alone;
	// a document not named is left as it was.
	f := s.setup(t)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		return tx.DocumentWriteMany(ctx, []store.DocumentWriteParams{{ID: "doc-1", Body: []byte(`{"a":1}`), Version: 1, AtMS: 9},
			{ID: "doc-3", Body: []byte(`{"c":[3]}`), Version: 4, AtMS: 9}})
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		one, three := must(tx.DocumentGet(ctx, "doc-1", store.NoLock)), must(tx.DocumentGet(ctx, "doc-3", store.NoLock))
		if string(one.Body) != `{"a":1}` || one.Version != 1 || string(three.Body) != `{"c":[3]}` || three.Version != 4 {
			t.Fatalf("documents written: %+v, %+v", one, three)
		}
		if j := must(tx.JobGet(ctx, "op-3", store.NoLock)); j.DocumentVersion != 4 {
			t.Fatalf("the job reads its document's version as %d", j.DocumentVersion)
		}
		if other := must(tx.DocumentGet(ctx, "doc-2", store.NoLock)); other.Version != 0 {
			t.Fatalf("another document changed: %+v", other)
		}
		return nil
	})
}

func testAssignmentList(t *testing.T, s *suite) {
	f := s.setup(t)
	f.claim("w1", 1, 50)
	f.write(func(ctx context.Context, tx *store.Tx) error {
		_, err := tx.DocumentAssign(ctx, &store.DocumentAssignParams{ID: "doc-1", Owner: "w2", Reason: "operator", AtMS: 20})
		return err
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		got := must(tx.AssignmentList(ctx, "doc-1"))
		if len(got) != 2 || got[0].Owner != "w1" || got[0].Generation != 1 || got[1] != (store.Assignment{DocumentID: "doc-1", Generation: 2, Owner: "w2", Reason: "operator", AtMS: 20}) {
			t.Fatalf("assignments oldest first: %+v", got)
		}
		if none := must(tx.AssignmentList(ctx, "doc-2")); len(none) != 0 {
			t.Fatalf("an unassigned document's: %+v", none)
		}
		return nil
	})
}

func testMutations(t *testing.T, s *suite) {
	f := s.setup(t)
	m := func(doc string, v int64, key string) store.Mutation {
		return store.Mutation{DocumentID: doc, Version: v, OperationKey: key, Caller: "w", AtMS: 9 + v}
	}
	// One row, then several in one statement (a batch's).
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if err := tx.MutationInsert(ctx, m("doc-1", 2, "k2")); err != nil {
			return err
		}
		return tx.MutationInsert(ctx, m("doc-1", 1, "k1"), m("doc-2", 1, "k1"))
	})
	// One operation key mutates its document at most once, whatever the
	// code above the database does; a statement of several rows with one
	// such row writes none of them.
	f.refused("an operation key mutating its document twice", func(ctx context.Context, tx *store.Tx) error {
		return tx.MutationInsert(ctx, m("doc-1", 3, "k1"))
	})
	f.refused("a batch's mutations, one of them twice", func(ctx context.Context, tx *store.Tx) error {
		return tx.MutationInsert(ctx, m("doc-2", 2, "k2"), m("doc-1", 3, "k2"))
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		list := must(tx.MutationList(ctx, "doc-1"))
		n := must(tx.MutationCount(ctx, "doc-1"))
		total := must(tx.MutationTotal(ctx))
		byDoc := must(tx.MutationCountByDocument(ctx))
		twice := must(tx.MutationRepeatedOperations(ctx))
		if !reflect.DeepEqual(list, []store.Mutation{m("doc-1", 1, "k1"), m("doc-1", 2, "k2")}) || n != 2 || total != 3 ||
			!reflect.DeepEqual(byDoc, map[string]int64{"doc-1": 2, "doc-2": 1}) || twice != 0 {
			t.Fatalf("list %+v, count %d, total %d, by document %v, repeated %d", list, n, total, byDoc, twice)
		}
		return nil
	})
}

func testOperations(t *testing.T, s *suite) {
	f := s.setup(t)
	op := store.StoredOperation{Binding: []byte(`{"tool":"x"}`), CreatedMS: 9, Operation: wire.Operation{DocumentID: "doc-1",
		OperationKey: "k", Caller: "w", Status: wire.StatusPublished, Outcome: json.RawMessage(`{"status":"published","version":1}`), Deliveries: 1}}
	refusal := store.StoredOperation{Binding: []byte(`{"tool":"y"}`), CreatedMS: 8, Operation: wire.Operation{DocumentID: "doc-1",
		OperationKey: "j", Caller: "w", Status: wire.StatusSuperseded, Outcome: json.RawMessage(`{"status":"superseded","version":0}`), Deliveries: 1}}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		if _, err := tx.OperationGet(ctx, "doc-1", "k"); !store.IsNotFound(err) {
			t.Fatalf("an absent operation: %v", err)
		}
		if err := tx.OperationInsert(ctx, refusal); err != nil {
			return err
		}
		if err := tx.OperationInsert(ctx, op); err != nil {
			return err
		}
		return tx.OperationCountDelivery(ctx, "doc-1", "k")
	})
	f.refused("one operation key retained twice", func(ctx context.Context, tx *store.Tx) error { return tx.OperationInsert(ctx, op) })
	// Several in one statement (a batch's): all of them, with every byte
	// of binding and outcome as given, or none.
	other := op
	other.DocumentID, other.Binding = "doc-3", []byte(`{"quote":"\"<&>\u2028","n":12345678901234567}`)
	another := refusal
	another.DocumentID = "doc-3"
	f.refused("a batch's operations, one key retained already", func(ctx context.Context, tx *store.Tx) error {
		return tx.OperationInsert(ctx, other, op)
	})
	f.write(func(ctx context.Context, tx *store.Tx) error { return tx.OperationInsert(ctx, other, another) })
	f.read(func(ctx context.Context, tx *store.Tx) error {
		for _, want := range []store.StoredOperation{other, another} {
			if got := must(tx.OperationGet(ctx, want.DocumentID, want.OperationKey)); !reflect.DeepEqual(got, want) {
				t.Fatalf("written in one statement %+v, read %+v", want, got)
			}
		}
		return nil
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		got := must(tx.OperationGet(ctx, "doc-1", "k"))
		list := must(tx.OperationList(ctx, "doc-1"))
		j := must(tx.JobGet(ctx, "op-1", store.NoLock))
		op.Deliveries = 2
		if !reflect.DeepEqual(got, op) || len(list) != 2 || !slices.ContainsFunc(list, func(o wire.Operation) bool { return reflect.DeepEqual(o, op.Operation) }) ||
			string(j.Outcome) != string(op.Outcome) {
			t.Fatalf("operation %+v, list %+v, job outcome %s", got, list, j.Outcome)
		}
		if empty := must(tx.OperationList(ctx, "doc-2")); empty == nil || len(empty) != 0 {
			t.Fatalf("no operations listed as %v", empty)
		}
		return nil
	})
}

func testOperationGetMany(t *testing.T, s *suite) {
	// Every asked pair that is retained, and whatever else comes back is
	// of the asked documents and keys.
	f := s.setup(t)
	stored := func(doc, key string) store.StoredOperation {
		return store.StoredOperation{Binding: []byte(`{"tool":"x"}`), CreatedMS: 9, Operation: wire.Operation{DocumentID: doc,
			OperationKey: key, Caller: "w", Status: wire.StatusSuperseded, Outcome: json.RawMessage(`{"status":"superseded","version":0}`), Deliveries: 1}}
	}
	f.write(func(ctx context.Context, tx *store.Tx) error {
		for _, o := range []store.StoredOperation{stored("doc-1", "a"), stored("doc-2", "b"), stored("doc-2", "a"), stored("doc-3", "c")} {
			if err := tx.OperationInsert(ctx, o); err != nil {
				return err
			}
		}
		return nil
	})
	f.read(func(ctx context.Context, tx *store.Tx) error {
		asked := []store.OperationRef{{DocumentID: "doc-1", Key: "a"}, {DocumentID: "doc-2", Key: "b"}, {DocumentID: "doc-1", Key: "nope"}}
		got := map[store.OperationRef]store.StoredOperation{}
		for _, o := range must(tx.OperationGetMany(ctx, asked)) {
			r := store.OperationRef{DocumentID: o.DocumentID, Key: o.OperationKey}
			if r.DocumentID == "doc-3" || r.Key == "c" || r.Key == "nope" {
				t.Fatalf("an operation not asked for: %+v", r)
			}
			got[r] = o
		}
		for _, r := range asked[:2] {
			if !reflect.DeepEqual(got[r], stored(r.DocumentID, r.Key)) {
				t.Fatalf("%+v read as %+v", r, got[r])
			}
		}
		if _, ok := got[asked[2]]; ok {
			t.Fatal("an absent operation was read")
		}
		return nil
	})
}
