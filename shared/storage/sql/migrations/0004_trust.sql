-- Trust nothing that arrives: who sent what, the arrival order of an order's blocked and parked
-- messages, and dead letters that do not block an order.

-- Rejections name the message by the body's id or else the AMQP message-id property, keep the
-- broker-verified sender, and keep a refused body's first bytes with its real size.
ALTER TABLE rejections ADD COLUMN transport_id text;
ALTER TABLE rejections ADD COLUMN sender text;
ALTER TABLE rejections ADD COLUMN body_bytes integer;
CREATE INDEX rejections_order_idx ON rejections (order_id, id);

-- One number line for everything an order holds back: a block takes a number when its message
-- first fails, a parked message when it is parked (a replayed one keeps its block's), so the
-- drain applies them in the order they arrived, whichever process stored them.
CREATE SEQUENCE convoy_arrival;
ALTER TABLE order_blocks ADD COLUMN arrival bigint NOT NULL DEFAULT nextval('convoy_arrival');
ALTER TABLE parked ADD COLUMN arrival bigint NOT NULL DEFAULT nextval('convoy_arrival');
CREATE INDEX parked_arrival_idx ON parked (order_id, arrival);

-- A dead letter keeps who sent it (user_id as the broker checked it), the AMQP message-id
-- property, where it stands in its order's arrival order, and whether it blocks its order: only a
-- valid message from its rightful sender that a handler kept failing on does.
ALTER TABLE dead_letters ADD COLUMN sender text;
ALTER TABLE dead_letters ADD COLUMN transport_id text;
ALTER TABLE dead_letters ADD COLUMN arrival bigint;
ALTER TABLE dead_letters ADD COLUMN blocks_order boolean NOT NULL DEFAULT true;
ALTER TABLE dead_letters ADD COLUMN body_bytes integer;
ALTER TABLE dlq_audit ADD COLUMN actor_role text;

-- Dead letters are told apart by where they died and who sent them, not by a message id alone:
-- a sender could choose the id of someone else's message. The same delivery seen twice (the
-- ingester died before its ack) still finds its row.
ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_message_id_key;
CREATE UNIQUE INDEX dead_letters_delivery_idx
    ON dead_letters (message_id, (coalesce(source_queue, '')), (coalesce(sender, '')));
ALTER TABLE dead_letters ADD COLUMN block_key text;
CREATE INDEX dead_letters_arrival_idx ON dead_letters (order_id, arrival, id);

-- A failure is recorded per queue: the same id on two queues is two messages.
ALTER TABLE delivery_failures DROP CONSTRAINT delivery_failures_pkey;
ALTER TABLE delivery_failures ADD PRIMARY KEY (message_id, queue);
