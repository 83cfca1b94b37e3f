package shard

import (
	"cmp"
	"context"
	"fmt"

	"github.com/redis/rueidis"
)

// A device may belong to one group (a gateway, a site). Its group lives in
// its registry partition (Keys.Group), written only when it changes, and
// each group keeps the set of its watched devices (Keys.GroupMembers) on a
// slot of its own, so that its size is one SCARD. The two cannot change in
// one script on a Redis Cluster: the membership is written first and the
// group after (by compare-and-set), and every sighting of a first-seen or
// back device writes its membership again, so a crash between the two is
// healed by the next one. A writer whose compare-and-set lost to another
// (a sighting racing the API) takes the device out of the groups it added
// it to (settleGroup): a device is in one group's membership, its own.

// setGroupScript writes a device's group if it is still the one the caller
// read.
//
// KEYS[1]: group HASH of the device
// ARGV[1]: device id; ARGV[2]: the group read ("" for none); ARGV[3]: the
// new group ("" removes it)
// Returns: 1 if written, 0 if the group had changed since.
var setGroupScript = NewScript(`
if (redis.call('HGET', KEYS[1], ARGV[1]) or '') ~= ARGV[2] then return 0 end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
return 1`)

// setGroupAttempts bounds the attempts of SetGroup against concurrent
// changes of the same device's group.
const setGroupAttempts = 8

// SetGroup sets the group of id ("" removes it) and returns the one it
// had. Nothing is written when the group is the one id has, but its
// membership is made sure of.
func (s *Store) SetGroup(ctx context.Context, id, group string) (prev string, err error) {
	for range setGroupAttempts {
		gs, err := s.Groups(ctx, []string{id})
		if err != nil {
			return "", err
		}
		prev = gs[0]
		if err := s.joinGroup(ctx, id, prev, group); err != nil {
			return prev, fmt.Errorf("shard: set group: %w", err)
		}
		if prev == group {
			return prev, nil
		}
		ok, err := setGroupScript.exec(ctx, s.c, []string{s.k.Group(id)}, []string{id, prev, group}).AsInt64()
		if err != nil {
			return prev, fmt.Errorf("shard: set group: %w", err)
		}
		// Won: a sighting that kept prev may have put the device back in
		// prev's membership since joinGroup took it out. Lost: another
		// write changed the group since it was read, and the device was
		// added to group for nothing. Either way the memberships settle.
		if err := s.settleGroup(ctx, id, []string{prev, group}); err != nil {
			return prev, fmt.Errorf("shard: set group: %w", err)
		}
		if ok == 1 {
			return prev, nil
		}
	}
	return prev, fmt.Errorf("shard: set group of %q: it keeps changing; try again", id)
}

// settleGroup makes the memberships of id agree with its group after a
// write that added it to the groups in added lost its compare-and-set: it
// is put in its group's membership and taken out of the others of added,
// until a read of its group after that sees it unchanged (a group changed
// meanwhile is settled too).
func (s *Store) settleGroup(ctx context.Context, id string, added []string) error {
	for range setGroupAttempts {
		gs, err := s.Groups(ctx, []string{id})
		if err != nil {
			return err
		}
		cur := gs[0]
		var cmds rueidis.Commands
		if cur != "" {
			cmds = append(cmds, s.c.B().Sadd().Key(s.k.GroupMembers(cur)).Member(id).Build())
		}
		for _, g := range added {
			if g != "" && g != cur {
				cmds = append(cmds, s.c.B().Srem().Key(s.k.GroupMembers(g)).Member(id).Build())
			}
		}
		for _, r := range s.c.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				return fmt.Errorf("settle group membership: %w", err)
			}
		}
		if gs, err = s.Groups(ctx, []string{id}); err != nil {
			return err
		}
		if gs[0] == cur {
			return nil
		}
		added = append(added, cur)
	}
	return fmt.Errorf("settle group membership of %q: its group keeps changing", id)
}

// joinGroup writes the membership of id for its move from group prev to
// group next ("" for none): idempotent, so it may be repeated.
func (s *Store) joinGroup(ctx context.Context, id, prev, next string) error {
	var cmds rueidis.Commands
	if next != "" {
		cmds = append(cmds, s.c.B().Sadd().Key(s.k.GroupMembers(next)).Member(id).Build())
	}
	if prev != "" && prev != next {
		cmds = append(cmds, s.c.B().Srem().Key(s.k.GroupMembers(prev)).Member(id).Build())
	}
	for _, r := range s.c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}

// leaveGroup takes id out of its group's membership.
func (s *Store) leaveGroup(ctx context.Context, id string) error {
	gs, err := s.Groups(ctx, []string{id})
	if err != nil || gs[0] == "" {
		return err
	}
	return s.joinGroup(ctx, id, gs[0], "")
}

// recordGroups writes the group of the sightings of ss that SeenMulti
// recorded: the membership of every device with a group (the one given,
// else the one it has) in one round trip, then the groups that changed in
// another. A failure is the sighting's Err.
func (s *Store) recordGroups(ctx context.Context, ss []Sighting) {
	var (
		cmds  rueidis.Commands
		owner []int
	)
	for j, d := range ss {
		if d.Err != nil {
			continue
		}
		next := d.Group
		if next == "" {
			next = d.Prev.Group
		}
		if next == "" {
			continue
		}
		cmds = append(cmds, s.c.B().Sadd().Key(s.k.GroupMembers(next)).Member(d.ID).Build())
		owner = append(owner, j)
		if d.Prev.Group != "" && d.Prev.Group != next {
			cmds = append(cmds, s.c.B().Srem().Key(s.k.GroupMembers(d.Prev.Group)).Member(d.ID).Build())
			owner = append(owner, j)
		}
	}
	failed := map[int]bool{}
	for k, r := range s.c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil && ss[owner[k]].Err == nil {
			ss[owner[k]].Err, failed[owner[k]] = fmt.Errorf("shard: record group membership: %w", err), true
		}
	}
	var (
		execs   []rueidis.LuaExec
		changed []int
	)
	for j, d := range ss {
		if d.Err == nil && d.Group != "" && d.Group != d.Prev.Group {
			execs = append(execs, rueidis.LuaExec{Keys: []string{s.k.Group(d.ID)}, Args: []string{d.ID, d.Prev.Group, d.Group}})
			changed = append(changed, j)
		}
	}
	// A group changed since it was read (by the API) stays as changed.
	for k, r := range setGroupScript.execMulti(ctx, s.c, execs...) {
		if err := r.Error(); err != nil {
			ss[changed[k]].Err = fmt.Errorf("shard: record group: %w", err)
		}
	}
	// A device put in a group's membership here whose group is now another
	// (the API changed it meanwhile) leaves that membership; one whose group
	// changed here leaves the group it had, where a write that kept it may
	// have put it back. A failure is healed by the next sighting.
	var ids, added []string
	for _, d := range ss {
		if g := cmp.Or(d.Group, d.Prev.Group); d.Err == nil && g != "" {
			ids, added = append(ids, d.ID), append(added, g)
		}
	}
	if len(ids) == 0 {
		return
	}
	cur, err := s.Groups(ctx, ids)
	if err != nil {
		return
	}
	changedFrom := make(map[string]string, len(changed))
	for _, j := range changed {
		changedFrom[ss[j].ID] = ss[j].Prev.Group
	}
	for k, id := range ids {
		// A device first seen with a group had no membership to come back.
		if prev := changedFrom[id]; cur[k] != added[k] || prev != "" {
			_ = s.settleGroup(ctx, id, []string{added[k], prev})
		}
	}
}

// Groups reads the groups of ids in one round trip ("" for none).
func (s *Store) Groups(ctx context.Context, ids []string) ([]string, error) {
	return s.fields(ctx, ids, s.k.Group, "read groups")
}

// GroupSize returns how many watched devices (live or lost, not removed)
// belong to group.
func (s *Store) GroupSize(ctx context.Context, group string) (int64, error) {
	n, err := s.c.Do(ctx, s.c.B().Scard().Key(s.k.GroupMembers(group)).Build()).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("shard: size of group %q: %w", group, err)
	}
	return n, nil
}

// GroupMembers returns the watched devices (live or lost, not removed) of
// group, for the few callers that act on a whole group at once (a
// Sparkplug node's death); a group's set is read in one call.
func (s *Store) GroupMembers(ctx context.Context, group string) ([]string, error) {
	ids, err := s.c.Do(ctx, s.c.B().Smembers().Key(s.k.GroupMembers(group)).Build()).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("shard: members of group %q: %w", group, err)
	}
	return ids, nil
}
