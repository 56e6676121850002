-- Placement 16.0.0's migrations up to a082b8bb98d0 on postgresql; written by tools/reference_schema_ddl
CREATE TABLE public.alembic_version (
    version_num character varying(32) NOT NULL
);

CREATE TABLE public.allocations (
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    id integer NOT NULL,
    resource_provider_id integer NOT NULL,
    consumer_id character varying(36) NOT NULL,
    resource_class_id integer NOT NULL,
    used integer NOT NULL
);

CREATE SEQUENCE public.allocations_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.allocations_id_seq OWNED BY public.allocations.id;

CREATE TABLE public.consumer_types (
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    id integer NOT NULL,
    name character varying(255) NOT NULL
);

CREATE SEQUENCE public.consumer_types_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.consumer_types_id_seq OWNED BY public.consumer_types.id;

CREATE TABLE public.consumers (
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    id integer NOT NULL,
    uuid character varying(36) NOT NULL,
    project_id integer NOT NULL,
    user_id integer NOT NULL,
    generation integer DEFAULT 0 NOT NULL,
    consumer_type_id integer
);

CREATE SEQUENCE public.consumers_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.consumers_id_seq OWNED BY public.consumers.id;

CREATE TABLE public.inventories (
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    id integer NOT NULL,
    resource_provider_id integer NOT NULL,
    resource_class_id integer NOT NULL,
    total integer NOT NULL,
    reserved integer NOT NULL,
    min_unit integer NOT NULL,
    max_unit integer NOT NULL,
    step_size integer NOT NULL,
    allocation_ratio double precision NOT NULL
);

CREATE SEQUENCE public.inventories_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.inventories_id_seq OWNED BY public.inventories.id;

CREATE TABLE public.placement_aggregates (
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    id integer NOT NULL,
    uuid character varying(36)
);

CREATE SEQUENCE public.placement_aggregates_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.placement_aggregates_id_seq OWNED BY public.placement_aggregates.id;

CREATE TABLE public.projects (
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    id integer NOT NULL,
    external_id character varying(255) NOT NULL
);

CREATE SEQUENCE public.projects_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.projects_id_seq OWNED BY public.projects.id;

CREATE TABLE public.resource_classes (
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    id integer NOT NULL,
    name character varying(255) NOT NULL
);

CREATE SEQUENCE public.resource_classes_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.resource_classes_id_seq OWNED BY public.resource_classes.id;

CREATE TABLE public.resource_provider_aggregates (
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    resource_provider_id integer NOT NULL,
    aggregate_id integer NOT NULL
);

CREATE TABLE public.resource_provider_traits (
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    trait_id integer NOT NULL,
    resource_provider_id integer NOT NULL
);

CREATE TABLE public.resource_providers (
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    id integer NOT NULL,
    uuid character varying(36) NOT NULL,
    name character varying(200),
    generation integer,
    root_provider_id integer,
    parent_provider_id integer
);

CREATE SEQUENCE public.resource_providers_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.resource_providers_id_seq OWNED BY public.resource_providers.id;

CREATE TABLE public.traits (
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    id integer NOT NULL,
    name character varying(255) NOT NULL
);

CREATE SEQUENCE public.traits_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.traits_id_seq OWNED BY public.traits.id;

CREATE TABLE public.users (
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    id integer NOT NULL,
    external_id character varying(255) NOT NULL
);

CREATE SEQUENCE public.users_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.users_id_seq OWNED BY public.users.id;

ALTER TABLE ONLY public.allocations ALTER COLUMN id SET DEFAULT nextval('public.allocations_id_seq'::regclass);

ALTER TABLE ONLY public.consumer_types ALTER COLUMN id SET DEFAULT nextval('public.consumer_types_id_seq'::regclass);

ALTER TABLE ONLY public.consumers ALTER COLUMN id SET DEFAULT nextval('public.consumers_id_seq'::regclass);

ALTER TABLE ONLY public.inventories ALTER COLUMN id SET DEFAULT nextval('public.inventories_id_seq'::regclass);

ALTER TABLE ONLY public.placement_aggregates ALTER COLUMN id SET DEFAULT nextval('public.placement_aggregates_id_seq'::regclass);

ALTER TABLE ONLY public.projects ALTER COLUMN id SET DEFAULT nextval('public.projects_id_seq'::regclass);

ALTER TABLE ONLY public.resource_classes ALTER COLUMN id SET DEFAULT nextval('public.resource_classes_id_seq'::regclass);

ALTER TABLE ONLY public.resource_providers ALTER COLUMN id SET DEFAULT nextval('public.resource_providers_id_seq'::regclass);

ALTER TABLE ONLY public.traits ALTER COLUMN id SET DEFAULT nextval('public.traits_id_seq'::regclass);

ALTER TABLE ONLY public.users ALTER COLUMN id SET DEFAULT nextval('public.users_id_seq'::regclass);

ALTER TABLE ONLY public.alembic_version
    ADD CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num);

ALTER TABLE ONLY public.allocations
    ADD CONSTRAINT allocations_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.consumer_types
    ADD CONSTRAINT consumer_types_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.consumers
    ADD CONSTRAINT consumers_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.inventories
    ADD CONSTRAINT inventories_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.placement_aggregates
    ADD CONSTRAINT placement_aggregates_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.projects
    ADD CONSTRAINT projects_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.resource_classes
    ADD CONSTRAINT resource_classes_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.resource_provider_aggregates
    ADD CONSTRAINT resource_provider_aggregates_pkey PRIMARY KEY (resource_provider_id, aggregate_id);

ALTER TABLE ONLY public.resource_provider_traits
    ADD CONSTRAINT resource_provider_traits_pkey PRIMARY KEY (trait_id, resource_provider_id);

ALTER TABLE ONLY public.resource_providers
    ADD CONSTRAINT resource_providers_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.traits
    ADD CONSTRAINT traits_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.consumer_types
    ADD CONSTRAINT uniq_consumer_types0name UNIQUE (name);

ALTER TABLE ONLY public.consumers
    ADD CONSTRAINT uniq_consumers0uuid UNIQUE (uuid);

ALTER TABLE ONLY public.inventories
    ADD CONSTRAINT uniq_inventories0resource_provider_resource_class UNIQUE (resource_provider_id, resource_class_id);

ALTER TABLE ONLY public.placement_aggregates
    ADD CONSTRAINT uniq_placement_aggregates0uuid UNIQUE (uuid);

ALTER TABLE ONLY public.projects
    ADD CONSTRAINT uniq_projects0external_id UNIQUE (external_id);

ALTER TABLE ONLY public.resource_classes
    ADD CONSTRAINT uniq_resource_classes0name UNIQUE (name);

ALTER TABLE ONLY public.resource_providers
    ADD CONSTRAINT uniq_resource_providers0name UNIQUE (name);

ALTER TABLE ONLY public.resource_providers
    ADD CONSTRAINT uniq_resource_providers0uuid UNIQUE (uuid);

ALTER TABLE ONLY public.traits
    ADD CONSTRAINT uniq_traits0name UNIQUE (name);

ALTER TABLE ONLY public.users
    ADD CONSTRAINT uniq_users0external_id UNIQUE (external_id);

ALTER TABLE ONLY public.users
    ADD CONSTRAINT users_pkey PRIMARY KEY (id);

CREATE INDEX allocations_consumer_id_idx ON public.allocations USING btree (consumer_id);

CREATE INDEX allocations_resource_class_id_idx ON public.allocations USING btree (resource_class_id);

CREATE INDEX allocations_resource_provider_class_used_idx ON public.allocations USING btree (resource_provider_id, resource_class_id, used);

CREATE INDEX consumers_consumer_type_id_idx ON public.consumers USING btree (consumer_type_id);

CREATE INDEX consumers_project_id_user_id_uuid_idx ON public.consumers USING btree (project_id, user_id, uuid);

CREATE INDEX consumers_project_id_uuid_idx ON public.consumers USING btree (project_id, uuid);

CREATE INDEX inventories_resource_class_id_idx ON public.inventories USING btree (resource_class_id);

CREATE INDEX resource_provider_aggregates_aggregate_id_idx ON public.resource_provider_aggregates USING btree (aggregate_id);

CREATE INDEX resource_provider_traits_resource_provider_trait_idx ON public.resource_provider_traits USING btree (resource_provider_id, trait_id);

CREATE INDEX resource_providers_parent_provider_id_idx ON public.resource_providers USING btree (parent_provider_id);

CREATE INDEX resource_providers_root_provider_id_idx ON public.resource_providers USING btree (root_provider_id);

ALTER TABLE ONLY public.consumers
    ADD CONSTRAINT consumers_consumer_type_id_fkey FOREIGN KEY (consumer_type_id) REFERENCES public.consumer_types(id);

ALTER TABLE ONLY public.resource_provider_traits
    ADD CONSTRAINT resource_provider_traits_resource_provider_id_fkey FOREIGN KEY (resource_provider_id) REFERENCES public.resource_providers(id);

ALTER TABLE ONLY public.resource_provider_traits
    ADD CONSTRAINT resource_provider_traits_trait_id_fkey FOREIGN KEY (trait_id) REFERENCES public.traits(id);

ALTER TABLE ONLY public.resource_providers
    ADD CONSTRAINT resource_providers_parent_provider_id_fkey FOREIGN KEY (parent_provider_id) REFERENCES public.resource_providers(id);

ALTER TABLE ONLY public.resource_providers
    ADD CONSTRAINT resource_providers_root_provider_id_fkey FOREIGN KEY (root_provider_id) REFERENCES public.resource_providers(id);

INSERT INTO alembic_version (version_num) VALUES ('a082b8bb98d0');

