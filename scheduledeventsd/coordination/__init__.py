"""What this VM shares with others: etcd's client, the events shared between peers, the
concurrency slots, and Pacemaker (its command line and the drainer that moves resources off)."""
