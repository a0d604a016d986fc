package publication_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/publication"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/testkit"
	"github.com/fleet/fleet/internal/wire"
)

const doc = "report-1"

var (
	workerA = fleet.Caller{ID: "worker-a", CredentialSHA256: fleet.DigestHex([]byte("token-a"))}
	workerB = fleet.Caller{ID: "worker-b", CredentialSHA256: fleet.DigestHex([]byte("token-b"))}
)

// setup creates a database in a temp dir with one document assigned to A at
// generation 1.
func setup(t *testing.T) (*publication.Resource, string) {
	t.Helper()
	path := storetest.NewLocation(t)
	ctx := context.Background()
	s, err := initialize(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.CreateDocument(ctx, doc); err != nil {
		t.Fatal(err)
	}
	if gen, err := s.Assign(ctx, doc, 0, workerA.ID); err != nil || gen != 1 {
		t.Fatalf("assign A: gen %d, %v", gen, err)
	}
	return s, path
}

func request(key string, gen, version int64, body string) wire.PublishRequest {
	return wire.PublishRequest{OperationKey: key, Generation: gen, ExpectedVersion: version, Body: json.RawMessage(body)}
}

// state is everything the resource holds about the document, for
// before/after comparisons.
type state struct {
	Doc        wire.Document
	Owner      string
	Mutations  int64
	Operations []wire.Operation
}

func snapshot(t *testing.T, s *publication.Resource) state {
	t.Helper()
	ctx := context.Background()
	d, err := s.Get(ctx, doc)
	if err != nil {
		t.Fatal(err)
	}
	n, err := s.MutationCount(ctx, doc)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := s.Operations(ctx, doc)
	if err != nil {
		t.Fatal(err)
	}
	return state{Doc: d, Owner: d.Owner, Mutations: n, Operations: ops}
}

func mustPublish(t *testing.T, s *publication.Resource, c fleet.Caller, req wire.PublishRequest, want wire.Status) publication.Result {
	t.Helper()
	res, err := s.Publish(context.Background(), doc, c, req)
	if err != nil {
		t.Fatalf("publish %s: %v", req.OperationKey, err)
	}
	if res.Outcome.Status != want {
		t.Fatalf("publish %s: status %s, want %s", req.OperationKey, res.Outcome.Status, want)
	}
	return res
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	x := testkit.MustJSON(t, a)
	y := testkit.MustJSON(t, b)
	return string(x) == string(y)
}

func assertCode(t *testing.T, err error, want wire.Code) {
	t.Helper()
	if got := fleet.ErrorCode(err); got != want {
		t.Fatalf("error %v: code %q, want %q", err, got, want)
	}
}

func TestPublish(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()

		t.Run("OK", func(t *testing.T) {
			s, _ := setup(t)
			res := mustPublish(t, s, workerA, request("op-1", 1, 0, `{"b":1, "a":2}`), wire.StatusPublished)
			if res.Outcome.Version != 1 || res.Replayed || string(res.Raw) != `{"status":"published","version":1}` {
				t.Fatalf("result %+v raw %s", res, res.Raw)
			}
			after := snapshot(t, s)
			if after.Doc.Version != 1 || string(after.Doc.Body) != `{"a":2,"b":1}` || after.Mutations != 1 {
				t.Fatalf("after publish: %+v", after)
			}
		})

		t.Run("SupersededWriterThatRereadNewest", func(t *testing.T) {
			s, _ := setup(t)
			mustPublish(t, s, workerA, request("a-1", 1, 0, `{"v":"a"}`), wire.StatusPublished)
			if _, err := s.Assign(ctx, doc, 1, workerB.ID); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, s)
			// A rereads the newest version and generation: it still is not the owner.
			newest, _ := s.Get(ctx, doc)
			res := mustPublish(t, s, workerA, request("a-2", newest.Generation, newest.Version, `{"v":"stale"}`), wire.StatusSuperseded)
			if res.Outcome.Version != 1 {
				t.Fatalf("superseded outcome version %d, want the current 1", res.Outcome.Version)
			}
			after := snapshot(t, s)
			if !equalJSON(t, before.Doc, after.Doc) || after.Mutations != before.Mutations {
				t.Fatalf("document changed by a superseded writer: before %+v after %+v", before, after)
			}
			if len(after.Operations) != len(before.Operations)+1 || after.Operations[1].Status != wire.StatusSuperseded || after.Operations[1].Caller != workerA.ID {
				t.Fatalf("refusal not retained with its caller: %+v", after.Operations)
			}
		})

		t.Run("OriginalWriteReplaysAfterReassignment", func(t *testing.T) {
			s, _ := setup(t)
			orig := request("a-1", 1, 0, `{"v":"a"}`)
			first := mustPublish(t, s, workerA, orig, wire.StatusPublished)
			if _, err := s.Assign(ctx, doc, 1, workerB.ID); err != nil {
				t.Fatal(err)
			}
			mustPublish(t, s, workerB, request("b-1", 2, 1, `{"v":"b"}`), wire.StatusPublished)
			before := snapshot(t, s)
			again := mustPublish(t, s, workerA, orig, wire.StatusPublished)
			if !again.Replayed || string(again.Raw) != string(first.Raw) {
				t.Fatalf("replay %+v raw %s, want %s", again, again.Raw, first.Raw)
			}
			after := snapshot(t, s)
			if after.Mutations != 2 || !equalJSON(t, before.Doc, after.Doc) {
				t.Fatalf("replay wrote: before %+v after %+v", before, after)
			}
			if after.Operations[0].Deliveries != 2 {
				t.Fatalf("deliveries %d, want 2", after.Operations[0].Deliveries)
			}
		})

		t.Run("ErrChangedCallerSameKey", func(t *testing.T) {
			s, _ := setup(t)
			req := request("shared-key", 1, 0, `{"v":"a"}`)
			mustPublish(t, s, workerA, req, wire.StatusPublished)
			before := snapshot(t, s)
			_, err := s.Publish(ctx, doc, workerB, req)
			assertCode(t, err, wire.CodeOperationConflict)
			// Same identity, another credential: still a different caller.
			other := fleet.Caller{ID: workerA.ID, CredentialSHA256: workerB.CredentialSHA256}
			_, err = s.Publish(ctx, doc, other, req)
			assertCode(t, err, wire.CodeOperationConflict)
			if after := snapshot(t, s); !equalJSON(t, before, after) {
				t.Fatalf("conflict changed state: before %+v after %+v", before, after)
			}
		})

		t.Run("ErrChangedArgumentsSameKey", func(t *testing.T) {
			s, _ := setup(t)
			mustPublish(t, s, workerA, request("k", 1, 0, `{"v":"a"}`), wire.StatusPublished)
			before := snapshot(t, s)
			for _, changed := range []wire.PublishRequest{
				request("k", 1, 0, `{"v":"b"}`),
				request("k", 1, 1, `{"v":"a"}`),
				request("k", 2, 0, `{"v":"a"}`),
			} {
				_, err := s.Publish(ctx, doc, workerA, changed)
				assertCode(t, err, wire.CodeOperationConflict)
			}
			// Key order and white space are not a difference: bodies are canonical.
			again := mustPublish(t, s, workerA, request("k", 1, 0, `{ "v" : "a" }`), wire.StatusPublished)
			if !again.Replayed {
				t.Fatal("canonically equal body was not a replay")
			}
			after := snapshot(t, s)
			if after.Mutations != before.Mutations || !equalJSON(t, before.Doc, after.Doc) {
				t.Fatalf("state changed: before %+v after %+v", before, after)
			}
		})

		t.Run("StaleVersionIsVersionConflict", func(t *testing.T) {
			s, _ := setup(t)
			mustPublish(t, s, workerA, request("a-1", 1, 0, `{"v":1}`), wire.StatusPublished)
			before := snapshot(t, s)
			res := mustPublish(t, s, workerA, request("a-2", 1, 0, `{"v":2}`), wire.StatusVersionConflict)
			if res.Outcome.Version != 1 {
				t.Fatalf("version_conflict reports version %d, want 1", res.Outcome.Version)
			}
			after := snapshot(t, s)
			if after.Mutations != 1 || !equalJSON(t, before.Doc, after.Doc) {
				t.Fatalf("version conflict wrote: %+v", after)
			}
		})

		t.Run("OwnerCheckedBeforeVersion", func(t *testing.T) {
			s, _ := setup(t)
			if _, err := s.Assign(ctx, doc, 1, workerB.ID); err != nil {
				t.Fatal(err)
			}
			// Wrong owner and wrong version: the owner check wins.
			mustPublish(t, s, workerA, request("a-1", 1, 7, `{}`), wire.StatusSuperseded)
		})

		t.Run("RetainedRefusalReplaysAfterHandBack", func(t *testing.T) {
			s, _ := setup(t)
			if _, err := s.Assign(ctx, doc, 1, workerB.ID); err != nil {
				t.Fatal(err)
			}
			refused := request("a-late", 2, 0, `{"v":"a"}`)
			mustPublish(t, s, workerA, refused, wire.StatusSuperseded)
			if _, err := s.Assign(ctx, doc, 2, workerA.ID); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, s)
			res := mustPublish(t, s, workerA, refused, wire.StatusSuperseded)
			if !res.Replayed {
				t.Fatal("refusal was decided afresh, not replayed")
			}
			after := snapshot(t, s)
			if after.Mutations != 0 || !equalJSON(t, before.Doc, after.Doc) {
				t.Fatalf("replayed refusal wrote: %+v", after)
			}
			// A new operation at the new generation publishes.
			mustPublish(t, s, workerA, request("a-new", 3, 0, `{"v":"a"}`), wire.StatusPublished)
		})

		t.Run("UnassignedIsSuperseded", func(t *testing.T) {
			s, _ := setup(t)
			if err := s.CreateDocument(ctx, "orphan"); err != nil {
				t.Fatal(err)
			}
			res, err := s.Publish(ctx, "orphan", workerA, request("x", 0, 0, `{}`))
			if err != nil || res.Outcome.Status != wire.StatusSuperseded {
				t.Fatalf("unassigned document: %+v, %v", res, err)
			}
		})

		t.Run("ErrNotFound", func(t *testing.T) {
			s, _ := setup(t)
			_, err := s.Publish(ctx, "missing", workerA, request("x", 1, 0, `{}`))
			assertCode(t, err, wire.CodeNotFound)
		})

		t.Run("Limits", func(t *testing.T) {
			s, _ := setup(t)
			before := snapshot(t, s)
			big := `{"x":"` + strings.Repeat("a", resource.MaxBodyBytes) + `"}`
			cases := map[string]struct {
				caller fleet.Caller
				req    wire.PublishRequest
			}{
				"empty key":          {workerA, request("", 1, 0, `{}`)},
				"long key":           {workerA, request(strings.Repeat("k", 513), 1, 0, `{}`)},
				"control in key":     {workerA, request("a\x00b", 1, 0, `{}`)},
				"negative gen":       {workerA, request("k", -1, 0, `{}`)},
				"negative version":   {workerA, request("k", 1, -1, `{}`)},
				"body too large":     {workerA, request("k", 1, 0, big)},
				"body not object":    {workerA, request("k", 1, 0, `[1]`)},
				"body malformed":     {workerA, request("k", 1, 0, `{"a":}`)},
				"empty caller":       {fleet.Caller{CredentialSHA256: workerA.CredentialSHA256}, request("k", 1, 0, `{}`)},
				"long caller":        {fleet.Caller{ID: strings.Repeat("c", 513), CredentialSHA256: workerA.CredentialSHA256}, request("k", 1, 0, `{}`)},
				"bad caller digest":  {fleet.Caller{ID: "worker-a", CredentialSHA256: "nothex"}, request("k", 1, 0, `{}`)},
				"duplicate body key": {workerA, request("k", 1, 0, `{"a":1,"a":2}`)},
			}
			for name, c := range cases {
				_, err := s.Publish(ctx, doc, c.caller, c.req)
				if fleet.ErrorCode(err) != wire.CodeInvalid {
					t.Errorf("%s: %v, want invalid_request", name, err)
				}
			}
			// 512 bytes is still allowed.
			mustPublish(t, s, workerA, request(strings.Repeat("k", 512), 1, 0, `{}`), wire.StatusPublished)
			after := snapshot(t, s)
			if len(after.Operations) != len(before.Operations)+1 {
				t.Fatalf("refused requests left records: %+v", after.Operations)
			}
		})

		t.Run("ErrVersionOverflow", func(t *testing.T) {
			s, _ := setup(t)
			err := s.DB.WithTx(ctx, func(tx *store.Tx) error {
				d, err := tx.DocumentGet(ctx, doc, store.ForUpdate)
				if err != nil {
					return err
				}
				return tx.DocumentWrite(ctx, &store.DocumentWriteParams{ID: doc, Body: d.Body, Version: math.MaxInt64, AtMS: tx.NowMS()})
			})
			if err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, s)
			_, err = s.Publish(ctx, doc, workerA, request("k", 1, math.MaxInt64, `{}`))
			assertCode(t, err, wire.CodeStateConflict)
			if after := snapshot(t, s); !equalJSON(t, before, after) {
				t.Fatalf("overflow changed state: %+v", after)
			}
		})
	})
}

func TestAssign(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		t.Run("ErrAssignmentConflict", func(t *testing.T) {
			s, _ := setup(t)
			before := snapshot(t, s)
			_, err := s.Assign(ctx, doc, 0, workerB.ID)
			assertCode(t, err, wire.CodeAssignmentConflict)
			if after := snapshot(t, s); !equalJSON(t, before, after) || after.Owner != workerA.ID {
				t.Fatalf("conflicting assign changed state: %+v", after)
			}
		})
		t.Run("History", func(t *testing.T) {
			s, _ := setup(t)
			if gen, err := s.Assign(ctx, doc, 1, workerB.ID); err != nil || gen != 2 {
				t.Fatalf("gen %d err %v", gen, err)
			}
			var owners []string
			err := s.DB.Read(ctx, func(tx *store.Tx) error {
				history, err := tx.AssignmentList(ctx, doc)
				for _, a := range history {
					owners = append(owners, a.Owner)
				}
				return err
			})
			if err != nil || strings.Join(owners, ",") != "worker-a,worker-b" {
				t.Fatalf("history %v err %v", owners, err)
			}
		})
		t.Run("ErrInvalidOwner", func(t *testing.T) {
			s, _ := setup(t)
			_, err := s.Assign(ctx, doc, 1, "")
			assertCode(t, err, wire.CodeInvalid)
		})
	})
}

func TestSurvivesReopen(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		s, path := setup(t)
		first := mustPublish(t, s, workerA, request("a-1", 1, 0, `{"v":"a"}`), wire.StatusPublished)
		if _, err := s.Assign(ctx, doc, 1, workerB.ID); err != nil {
			t.Fatal(err)
		}
		mustPublish(t, s, workerA, request("a-2", 2, 1, `{"v":"x"}`), wire.StatusSuperseded)
		before := snapshot(t, s)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		reopened, err := open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer reopened.Close()
		after := snapshot(t, reopened)
		if !equalJSON(t, before, after) {
			t.Fatalf("reopen lost state:\nbefore %+v\nafter  %+v", before, after)
		}
		again := mustPublish(t, reopened, workerA, request("a-1", 1, 0, `{"v":"a"}`), wire.StatusPublished)
		if !again.Replayed || string(again.Raw) != string(first.Raw) {
			t.Fatalf("replay after reopen: %+v", again)
		}
	})
}

func TestOpenRefuses(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()

	t.Run("MissingPath", func(t *testing.T) {
		_, err := open(ctx, filepath.Join(dir, "missing.sqlite3"))
		if err == nil || !strings.Contains(err.Error(), "no such file") {
			t.Fatalf("err %v", err)
		}
		if _, statErr := os.Stat(filepath.Join(dir, "missing.sqlite3")); !os.IsNotExist(statErr) {
			t.Fatal("open created the missing file")
		}
	})
	t.Run("NotADatabase", func(t *testing.T) {
		p := filepath.Join(dir, "text.sqlite3")
		testkit.WriteFile(t, p, []byte("just some text, definitely not SQLite"), 0o600)
		_, err := open(ctx, p)
		if err == nil || !strings.Contains(err.Error(), "not a SQLite database") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("ForeignDatabase", func(t *testing.T) {
		p := filepath.Join(dir, "foreign.sqlite3")
		db, err := sql.Open("sqlite", p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(`CREATE TABLE documents (id TEXT); PRAGMA user_version = 1`); err != nil {
			t.Fatal(err)
		}
		db.Close()
		_, err = open(ctx, p)
		if err == nil || !strings.Contains(err.Error(), "not a Fleet database") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("UnknownSchemaVersion", func(t *testing.T) {
		_, p := setup(t)
		db, err := sql.Open("sqlite", p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(`PRAGMA user_version = 99`); err != nil {
			t.Fatal(err)
		}
		db.Close()
		_, err = open(ctx, p)
		if err == nil || !strings.Contains(err.Error(), "unknown schema version 99") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("InitializeExistingPath", func(t *testing.T) {
		_, p := setup(t)
		info, _ := os.Stat(p)
		_, err := initialize(ctx, p)
		if err == nil || !strings.Contains(err.Error(), "already exists") {
			t.Fatalf("err %v", err)
		}
		if after, _ := os.Stat(p); after.Size() != info.Size() {
			t.Fatal("initialize touched the existing file")
		}
		empty := filepath.Join(dir, "empty")
		testkit.WriteFile(t, empty, nil, 0o600)
		if _, err := initialize(ctx, empty); err == nil {
			t.Fatal("initialize accepted an existing empty file")
		}
	})
}

// A decoded request whose body is changed afterwards is validated again.
func TestChangedBodyRevalidated(t *testing.T) {
	req, err := resource.DecodePublishRequest([]byte(`{"operation_key":"k","generation":1,"expected_version":0,"body":{"a":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Body = json.RawMessage(`[1]`)
	s, _ := setup(t)
	if _, err := s.Publish(t.Context(), doc, workerA, req.PublishRequest); fleet.ErrorCode(err) != wire.CodeInvalid {
		t.Fatalf("a body changed after decoding was not revalidated: %v", err)
	}
}
