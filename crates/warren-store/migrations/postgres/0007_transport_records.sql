-- Records the transports that speak other systems' APIs keep beside warren's own rows (the
-- E2B API's sandboxes and keys), per namespace. Every write names the version it read, so
-- two replicas changing one record never both win.
CREATE TABLE transport_records (
    namespace  TEXT COLLATE "C" NOT NULL,
    key        TEXT COLLATE "C" NOT NULL,
    value      BYTEA  NOT NULL,
    version    BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (namespace, key)
);
