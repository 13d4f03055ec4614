/* pjrt_api.h: our own declarations of the subset of the PJRT C API that the
 * runtime uses. ABI facts: every argument struct begins with struct_size and
 * an extension pointer; structs and the function table only grow by appending
 * fields; struct_size is the offset of the last field plus its size (not
 * sizeof, which may include tail padding). Plugins reject a struct_size
 * smaller than the one they were built with, so our structs carry fields up
 * to the newest version we know. Every function takes a pointer to its
 * argument struct and returns an error (NULL on success), except the three
 * error accessors, which return nothing.
 */
#ifndef TPU_PJRT_API_H
#define TPU_PJRT_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TPU_PJRT_SIZE(type, last) (offsetof(type, last) + sizeof(((type *)0)->last))

typedef struct tpu_pjrt_error tpu_pjrt_error;
typedef struct tpu_pjrt_client tpu_pjrt_client;
typedef struct tpu_pjrt_device tpu_pjrt_device;
typedef struct tpu_pjrt_device_desc tpu_pjrt_device_desc;
typedef struct tpu_pjrt_event tpu_pjrt_event;
typedef struct tpu_pjrt_buffer tpu_pjrt_buffer;
typedef struct tpu_pjrt_loaded_exec tpu_pjrt_loaded_exec;
typedef struct tpu_pjrt_exec tpu_pjrt_exec;
typedef struct tpu_pjrt_serialized tpu_pjrt_serialized;

typedef tpu_pjrt_error *(*tpu_pjrt_fn)(void *args);

/* The function table, in ABI order. */
#define TPU_PJRT_ENTRIES(X)                    \
  X(Error_Destroy)                             \
  X(Error_Message)                             \
  X(Error_GetCode)                             \
  X(Plugin_Initialize)                         \
  X(Plugin_Attributes)                         \
  X(Event_Destroy)                             \
  X(Event_IsReady)                             \
  X(Event_Error)                               \
  X(Event_Await)                               \
  X(Event_OnReady)                             \
  X(Client_Create)                             \
  X(Client_Destroy)                            \
  X(Client_PlatformName)                       \
  X(Client_ProcessIndex)                       \
  X(Client_PlatformVersion)                    \
  X(Client_Devices)                            \
  X(Client_AddressableDevices)                 \
  X(Client_LookupDevice)                       \
  X(Client_LookupAddressableDevice)            \
  X(Client_AddressableMemories)                \
  X(Client_Compile)                            \
  X(Client_DefaultDeviceAssignment)            \
  X(Client_BufferFromHostBuffer)               \
  X(DeviceDescription_Id)                      \
  X(DeviceDescription_ProcessIndex)            \
  X(DeviceDescription_Attributes)              \
  X(DeviceDescription_Kind)                    \
  X(DeviceDescription_DebugString)             \
  X(DeviceDescription_ToString)                \
  X(Device_GetDescription)                     \
  X(Device_IsAddressable)                      \
  X(Device_LocalHardwareId)                    \
  X(Device_AddressableMemories)                \
  X(Device_DefaultMemory)                      \
  X(Device_MemoryStats)                        \
  X(Memory_Id)                                 \
  X(Memory_Kind)                               \
  X(Memory_DebugString)                        \
  X(Memory_ToString)                           \
  X(Memory_AddressableByDevices)               \
  X(Executable_Destroy)                        \
  X(Executable_Name)                           \
  X(Executable_NumReplicas)                    \
  X(Executable_NumPartitions)                  \
  X(Executable_NumOutputs)                     \
  X(Executable_SizeOfGeneratedCodeInBytes)     \
  X(Executable_GetCostAnalysis)                \
  X(Executable_OutputMemoryKinds)              \
  X(Executable_OptimizedProgram)               \
  X(Executable_Serialize)                      \
  X(LoadedExecutable_Destroy)                  \
  X(LoadedExecutable_GetExecutable)            \
  X(LoadedExecutable_AddressableDevices)       \
  X(LoadedExecutable_Delete)                   \
  X(LoadedExecutable_IsDeleted)                \
  X(LoadedExecutable_Execute)                  \
  X(Executable_DeserializeAndLoad)             \
  X(LoadedExecutable_Fingerprint)              \
  X(Buffer_Destroy)                            \
  X(Buffer_ElementType)                        \
  X(Buffer_Dimensions)                         \
  X(Buffer_UnpaddedDimensions)                 \
  X(Buffer_DynamicDimensionIndices)            \
  X(Buffer_GetMemoryLayout)                    \
  X(Buffer_OnDeviceSizeInBytes)                \
  X(Buffer_Device)                             \
  X(Buffer_Memory)                             \
  X(Buffer_Delete)                             \
  X(Buffer_IsDeleted)                          \
  X(Buffer_CopyToDevice)                       \
  X(Buffer_ToHostBuffer)                       \
  X(Buffer_IsOnCpu)                            \
  X(Buffer_ReadyEvent)                         \
  X(Buffer_UnsafePointer)                      \
  X(Buffer_IncreaseExternalReferenceCount)     \
  X(Buffer_DecreaseExternalReferenceCount)     \
  X(Buffer_OpaqueDeviceMemoryDataPointer)      \
  X(CopyToDeviceStream_Destroy)                \
  X(CopyToDeviceStream_AddChunk)               \
  X(CopyToDeviceStream_TotalBytes)             \
  X(CopyToDeviceStream_GranuleSize)            \
  X(CopyToDeviceStream_CurrentBytes)           \
  X(TopologyDescription_Create)                \
  X(TopologyDescription_Destroy)               \
  X(TopologyDescription_PlatformName)          \
  X(TopologyDescription_PlatformVersion)       \
  X(TopologyDescription_GetDeviceDescriptions) \
  X(TopologyDescription_Serialize)             \
  X(TopologyDescription_Attributes)            \
  X(Compile)                                   \
  X(Executable_OutputElementTypes)             \
  X(Executable_OutputDimensions)               \
  X(Buffer_CopyToMemory)                       \
  X(Client_CreateViewOfDeviceBuffer)           \
  X(Executable_Fingerprint)                    \
  X(Client_TopologyDescription)                \
  X(Executable_GetCompiledMemoryStats)

typedef struct {
  size_t struct_size;
  void *extension_start;
  int major_version;
  int minor_version;
} tpu_pjrt_version;

typedef struct {
  size_t struct_size;
  void *extension_start;
  tpu_pjrt_version pjrt_api_version;
#define TPU_PJRT_FIELD(name) tpu_pjrt_fn name;
  TPU_PJRT_ENTRIES(TPU_PJRT_FIELD)
#undef TPU_PJRT_FIELD
} tpu_pjrt_api;

typedef const tpu_pjrt_api *(*tpu_pjrt_get_api_fn)(void);

/* The entries the runtime cannot work without; tpu_rt_open refuses a plugin
 * whose table lacks any of them (the optional ones, Plugin_Initialize,
 * Device_MemoryStats, Executable_Serialize and Executable_DeserializeAndLoad,
 * are checked where they are used). */
/* clang-format off */
#define TPU_PJRT_REQUIRED(X) \
  X(Error_Destroy) X(Error_Message) X(Error_GetCode) X(Event_Destroy) X(Event_Await) X(Client_Create) \
  X(Client_Destroy) X(Client_PlatformName) X(Client_PlatformVersion) X(Client_AddressableDevices) \
  X(Client_Compile) X(Client_BufferFromHostBuffer) X(DeviceDescription_Kind) X(Device_GetDescription) \
  X(Executable_Destroy) X(Executable_NumOutputs) X(LoadedExecutable_Destroy) \
  X(LoadedExecutable_GetExecutable) X(LoadedExecutable_Execute) X(Buffer_Destroy) X(Buffer_ElementType) \
  X(Buffer_Dimensions) X(Buffer_ToHostBuffer)
/* clang-format on */

/* Error codes (absl's canonical codes) that the runtime maps to its own. */
enum { TPU_PJRT_INVALID_ARGUMENT = 3, TPU_PJRT_RESOURCE_EXHAUSTED = 8, TPU_PJRT_UNIMPLEMENTED = 12 };

/* ---- argument structs ------------------------------------------------------ */

#define TPU_PJRT_HEAD \
  size_t struct_size; \
  void *extension_start

typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_error *error;
} tpu_pjrt_error_destroy_args;
typedef struct {
  TPU_PJRT_HEAD;
  const tpu_pjrt_error *error;
  const char *message;
  size_t message_size;
} tpu_pjrt_error_message_args;
typedef struct {
  TPU_PJRT_HEAD;
  const tpu_pjrt_error *error;
  int code;
} tpu_pjrt_error_code_args;
typedef struct {
  TPU_PJRT_HEAD;
} tpu_pjrt_plugin_init_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_event *event;
} tpu_pjrt_event_args; /* Destroy and Await */
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_event *event;
  bool is_ready;
} tpu_pjrt_event_is_ready_args;
/* Called once the event is ready, on a plugin thread (or at once, in the
 * caller's, when it already is); it owns error and destroys it. */
typedef void (*tpu_pjrt_on_ready_fn)(tpu_pjrt_error *error, void *user_arg);
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_event *event;
  tpu_pjrt_on_ready_fn callback;
  void *user_arg;
} tpu_pjrt_event_on_ready_args;

enum {
  TPU_PJRT_NV_STRING = 0,
  TPU_PJRT_NV_INT64 = 1,
  TPU_PJRT_NV_INT64_LIST = 2,
  TPU_PJRT_NV_FLOAT = 3,
  TPU_PJRT_NV_BOOL = 4
};
typedef struct {
  TPU_PJRT_HEAD;
  const char *name;
  size_t name_size;
  int type;
  union {
    const char *string_value;
    int64_t int64_value;
    const int64_t *int64_array_value;
    float float_value;
    bool bool_value;
  };
  size_t value_size;
} tpu_pjrt_named_value;

typedef struct {
  TPU_PJRT_HEAD;
  const tpu_pjrt_named_value *create_options;
  size_t num_options;
  void *kv_get_callback;
  void *kv_get_user_arg;
  void *kv_put_callback;
  void *kv_put_user_arg;
  tpu_pjrt_client *client; /* out */
  void *kv_try_get_callback;
  void *kv_try_get_user_arg;
} tpu_pjrt_client_create_args;

typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_client *client;
} tpu_pjrt_client_destroy_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_client *client;
  const char *str;
  size_t size;
} tpu_pjrt_client_string_args; /* PlatformName, PlatformVersion */
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_client *client;
  tpu_pjrt_device *const *devices;
  size_t num_devices;
} tpu_pjrt_client_devices_args;

typedef struct {
  TPU_PJRT_HEAD;
  char *code;
  size_t code_size;
  const char *format;
  size_t format_size;
} tpu_pjrt_program;

typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_client *client;
  const tpu_pjrt_program *program;
  const char *compile_options;
  size_t compile_options_size;
  tpu_pjrt_loaded_exec *executable; /* out */
} tpu_pjrt_compile_args;

enum { TPU_PJRT_HOST_IMMUTABLE_ONLY_DURING_CALL = 0, TPU_PJRT_HOST_IMMUTABLE_UNTIL_TRANSFER_COMPLETES = 1 };
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_client *client;
  const void *data;
  int type;
  const int64_t *dims;
  size_t num_dims;
  const int64_t *byte_strides;
  size_t num_byte_strides;
  int host_buffer_semantics;
  tpu_pjrt_device *device;
  void *memory;
  void *device_layout;
  tpu_pjrt_event *done_with_host_buffer; /* out */
  tpu_pjrt_buffer *buffer;               /* out */
} tpu_pjrt_from_host_args;

typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_device *device;
  tpu_pjrt_device_desc *desc;
} tpu_pjrt_device_desc_args;

typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_buffer *buffer;
  tpu_pjrt_device *dst_device;
  tpu_pjrt_buffer *dst_buffer; /* out */
} tpu_pjrt_copy_to_device_args;

/* Buffer_IsOnCpu, Buffer_ReadyEvent, Buffer_UnsafePointer: one buffer in,
 * one answer out. */
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_buffer *buffer;
  bool is_on_cpu; /* out */
} tpu_pjrt_is_on_cpu_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_buffer *buffer;
  tpu_pjrt_event *event; /* out, owned by the caller */
} tpu_pjrt_ready_event_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_buffer *buffer;
  uintptr_t buffer_pointer; /* out */
} tpu_pjrt_unsafe_pointer_args;

typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_loaded_exec *executable;
  tpu_pjrt_device *const *devices; /* out, owned by the executable */
  size_t num_devices;              /* out */
} tpu_pjrt_exec_devices_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_device_desc *desc;
  const char *kind;
  size_t kind_size;
} tpu_pjrt_desc_kind_args;

/* Only bytes_in_use is mandatory; each optional statistic has a flag. */
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_device *device;
  int64_t bytes_in_use;
  int64_t peak_bytes_in_use;
  bool peak_bytes_in_use_is_set;
  int64_t num_allocs;
  bool num_allocs_is_set;
  int64_t largest_alloc_size;
  bool largest_alloc_size_is_set;
  int64_t bytes_limit;
  bool bytes_limit_is_set;
  int64_t bytes_reserved;
  bool bytes_reserved_is_set;
  int64_t peak_bytes_reserved;
  bool peak_bytes_reserved_is_set;
  int64_t bytes_reservable_limit;
  bool bytes_reservable_limit_is_set;
  int64_t largest_free_block_bytes;
  bool largest_free_block_bytes_is_set;
  int64_t pool_bytes;
  bool pool_bytes_is_set;
  int64_t peak_pool_bytes;
  bool peak_pool_bytes_is_set;
} tpu_pjrt_memory_stats_args;

typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_exec *executable;
} tpu_pjrt_exec_destroy_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_exec *executable;
  size_t num_outputs;
} tpu_pjrt_num_outputs_args;
typedef struct {
  TPU_PJRT_HEAD;
  const tpu_pjrt_exec *executable;
  const char *bytes;
  size_t bytes_size;
  tpu_pjrt_serialized *serialized;
  void (*deleter)(tpu_pjrt_serialized *s);
} tpu_pjrt_serialize_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_loaded_exec *executable;
} tpu_pjrt_loaded_destroy_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_loaded_exec *loaded;
  tpu_pjrt_exec *executable;
} tpu_pjrt_get_exec_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_exec *executable;
  tpu_pjrt_program *program; /* code NULL: its size is set */
} tpu_pjrt_optimized_args;

typedef struct {
  TPU_PJRT_HEAD;
  void **send_callbacks;
  void **recv_callbacks;
  size_t num_send_ops;
  size_t num_recv_ops;
  int launch_id;
  const int64_t *non_donatable_input_indices;
  size_t num_non_donatable_input_indices;
  void *context;
  const char *call_location;
  size_t num_tasks;
  int *task_ids;
  int64_t *incarnation_ids;
  void *multi_slice_config; /* newer than 0.81 (present in 0.104) */
} tpu_pjrt_execute_options;

typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_loaded_exec *executable;
  tpu_pjrt_execute_options *options;
  tpu_pjrt_buffer *const *const *argument_lists;
  size_t num_devices;
  size_t num_args;
  tpu_pjrt_buffer **const *output_lists;
  tpu_pjrt_event **device_complete_events;
  tpu_pjrt_device *execute_device;
} tpu_pjrt_execute_args;

typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_client *client;
  const char *serialized;
  size_t serialized_size;
  tpu_pjrt_loaded_exec *loaded; /* out */
  const char *overridden_compile_options;
  size_t overridden_compile_options_size;
} tpu_pjrt_deserialize_args;

typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_buffer *buffer;
} tpu_pjrt_buffer_destroy_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_buffer *buffer;
  int type;
} tpu_pjrt_element_type_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_buffer *buffer;
  const int64_t *dims; /* lifetime of the buffer */
  size_t num_dims;
} tpu_pjrt_dimensions_args;

/* A memory layout: a tiled one (minor-to-major order, optional tiles) or byte
 * strides, in a union followed by the tag. We only ever send tiled, untiled
 * layouts; the strides member is declared for the union's size. */
enum { TPU_PJRT_LAYOUT_TILED = 0, TPU_PJRT_LAYOUT_STRIDES = 1 };
typedef struct {
  TPU_PJRT_HEAD;
  const int64_t *minor_to_major;
  size_t minor_to_major_size;
  const int64_t *tile_dims;
  const size_t *tile_dim_sizes;
  size_t num_tiles;
} tpu_pjrt_layout_tiled;
typedef struct {
  TPU_PJRT_HEAD;
  const int64_t *byte_strides;
  size_t num_byte_strides;
} tpu_pjrt_layout_strides;
typedef struct {
  TPU_PJRT_HEAD;
  union {
    tpu_pjrt_layout_tiled tiled;
    tpu_pjrt_layout_strides strides;
  };
  int type;
} tpu_pjrt_layout;

typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_buffer *src;
  tpu_pjrt_layout *host_layout; /* NULL: the buffer's own layout */
  void *dst;
  size_t dst_size;
  tpu_pjrt_event *event; /* out */
} tpu_pjrt_to_host_args;

/* ---- compiling for a topology without a client (aot.c) -------------------- */

typedef struct tpu_pjrt_topology tpu_pjrt_topology;

typedef struct {
  TPU_PJRT_HEAD;
  const char *topology_name;
  size_t topology_name_size;
  const tpu_pjrt_named_value *create_options;
  size_t num_options;
  tpu_pjrt_topology *topology; /* out */
} tpu_pjrt_topology_create_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_topology *topology;
} tpu_pjrt_topology_destroy_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_topology *topology;
  const char *str;               /* out, lifetime of the topology */
  size_t size;                   /* out */
} tpu_pjrt_topology_string_args; /* PlatformName, PlatformVersion */
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_topology *topology;
  tpu_pjrt_device_desc *const *descriptions; /* out, lifetime of the topology */
  size_t num_descriptions;                   /* out */
} tpu_pjrt_topology_devices_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_device_desc *desc;
  size_t num_attributes;                  /* out */
  const tpu_pjrt_named_value *attributes; /* out, lifetime of the description */
} tpu_pjrt_desc_attributes_args;

/* PJRT_Compile: client may be NULL (compile-only); the executable is not loaded. */
typedef struct {
  TPU_PJRT_HEAD;
  const tpu_pjrt_topology *topology;
  const tpu_pjrt_program *program;
  const char *compile_options;
  size_t compile_options_size;
  tpu_pjrt_client *client;
  tpu_pjrt_exec *executable; /* out */
} tpu_pjrt_topology_compile_args;

typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_exec *executable;
  size_t num_partitions; /* out */
} tpu_pjrt_num_partitions_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_exec *executable;
  size_t num_properties;                  /* out */
  const tpu_pjrt_named_value *properties; /* out, lifetime of the executable */
} tpu_pjrt_cost_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_exec *executable;
  const char *fingerprint; /* out, lifetime of the executable */
  size_t fingerprint_size; /* out */
} tpu_pjrt_fingerprint_args;
typedef struct {
  TPU_PJRT_HEAD;
  tpu_pjrt_exec *executable;
  int64_t generated_code_size_in_bytes; /* out: device memory */
  int64_t argument_size_in_bytes;
  int64_t output_size_in_bytes;
  int64_t alias_size_in_bytes;
  int64_t temp_size_in_bytes;
  int64_t host_generated_code_size_in_bytes; /* out: host memory */
  int64_t host_argument_size_in_bytes;
  int64_t host_output_size_in_bytes;
  int64_t host_alias_size_in_bytes;
  int64_t host_temp_size_in_bytes;
  int64_t peak_memory_in_bytes; /* out: device */
} tpu_pjrt_memory_args;

#endif
