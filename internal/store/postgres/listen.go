package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleet/fleet/internal/retry"
)

// Hosts learn that another host's sequencer placed log entries through
// LISTEN/NOTIFY: the round's statement notifies the schema's channel, and
// PostgreSQL delivers it to every listener when the round commits. A host
// whose requests wait for entries another host placed then finds them
// placed without taking the log lock itself.

// channelFor names a schema's channel (identifiers are at most 63 bytes;
// NOTIFY is per database, so the schema is in the name).
func channelFor(schema string) string {
	sum := sha256.Sum256([]byte(schema))
	return "fleet_log_" + hex.EncodeToString(sum[:8])
}

// resolveChannel reads the schema the URL's search_path names.
func (d *driver) resolveChannel(ctx context.Context) error {
	var schema string
	if err := d.pool.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return classify(err)
	}
	d.channel = channelFor(schema)
	return nil
}

// Placed fires (coalesced) whenever a sequencer round of any host on this
// schema commits. The listener connects on first use and reconnects after
// a failure; until it has, a waiting host still learns by its own rounds.
func (d *driver) Placed() <-chan struct{} {
	d.listenOnce.Do(func() {
		d.placed = make(chan struct{}, 1)
		ctx, cancel := context.WithCancel(context.Background())
		d.stopListen = cancel
		d.listening.Add(1)
		go d.listen(ctx)
	})
	return d.placed
}

func (d *driver) listen(ctx context.Context) {
	defer d.listening.Done()
	waits := retry.New(10*time.Millisecond, time.Second)
	for ctx.Err() == nil {
		if err := d.listenOnce1(ctx); err == nil || ctx.Err() != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(waits.NextBackOff()):
		}
	}
}

func (d *driver) listenOnce1(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, d.session.Copy())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{d.channel}.Sanitize()); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// Rounds may have committed while the listener was away.
	d.signal()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Payload != d.instance { // this process's own rounds it knows of
			d.signal()
		}
	}
}

func (d *driver) signal() {
	select {
	case d.placed <- struct{}{}:
	default:
	}
}
