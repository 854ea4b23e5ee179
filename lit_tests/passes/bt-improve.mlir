// RUN: stageml-opt %s -p bt-improve | filecheck %s
// RUN: stageml-opt %s -p 'bt-improve{merge-lora=false}' | filecheck %s --check-prefix=NOMERGE
// RUN: stageml-opt %s -p bt-improve | filecheck %s --check-prefix=FACTORIZED

// Three request-time linear forms in x (%arg5), on bt-propagate's output:
//   %7  = x @ W^T + 2 * ((x @ A^T) @ B^T)   LoRA: merged into one x @ M, M built at adapter time
//   %9  = (x @ A^T) @ B^T                   a low-rank pair alone: x @ (A^T B^T) would cost more, kept
//   %11 = (x @ P) @ Q                       a wide chain: reassociated to x @ (P @ Q), P @ Q static

// CHECK-LABEL: func.func @main
// CHECK:      %[[WT:[0-9]+]] = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">}
// CHECK-NEXT: %[[AT:[0-9]+]] = torch.aten.transpose.int %arg1, %int0, %int1 {bt.time = #bt.time<"adapter">}
// CHECK-NEXT: %[[BT:[0-9]+]] = torch.aten.transpose.int %arg2, %int0, %int1 {bt.time = #bt.time<"adapter">}
// CHECK-NEXT: %[[AB:[0-9]+]] = torch.aten.mm %[[AT]], %[[BT]] {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,2],f32>, !torch.vtensor<[2,16],f32> -> !torch.vtensor<[8,16],f32>
// CHECK-NEXT: %[[S:[0-9]+]] = torch.aten.mul.Scalar %[[AB]], %float2.000000e00 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,16],f32>, !torch.float -> !torch.vtensor<[8,16],f32>
// CHECK-NEXT: %[[M:[0-9]+]] = torch.aten.add.Tensor %[[WT]], %[[S]], %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,16],f32>, !torch.vtensor<[8,16],f32>, !torch.int -> !torch.vtensor<[8,16],f32>
// CHECK-NEXT: %[[Y0:[0-9]+]] = torch.aten.matmul %arg5, %[[M]] {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,16],f32> -> !torch.vtensor<[?,16],f32>
// The low-rank pair is not reassociated: no torch.aten.mm before it.
// CHECK-NEXT: %[[XA:[0-9]+]] = torch.aten.matmul %arg5, %[[AT]] {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT: %[[Y1:[0-9]+]] = torch.aten.matmul %[[XA]], %[[BT]] {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT: %[[PQ:[0-9]+]] = torch.aten.mm %arg3, %arg4 {bt.time = #bt.time<"static">} : !torch.vtensor<[8,16],f32>, !torch.vtensor<[16,4],f32> -> !torch.vtensor<[8,4],f32>
// CHECK-NEXT: %[[Y2:[0-9]+]] = torch.aten.matmul %arg5, %[[PQ]] {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
// CHECK-NEXT: return %[[Y0]], %[[Y1]], %[[Y2]] :
// The factors' request-time products and the original sum are gone.
// CHECK-NOT:  torch.aten.add.Tensor
// CHECK-NOT:  torch.aten.mul.Scalar
// CHECK-LABEL: func.func @main_factorized

// With merge-lora=false the adapter stays factorized at request time; the
// static-only reassociation still happens.
// NOMERGE-LABEL: func.func @main
// NOMERGE-NOT:   torch.aten.mm
// NOMERGE:       %[[XW:[0-9]+]] = torch.aten.matmul %arg5, %{{[0-9]+}} {bt.time = #bt.time<"dynamic">}
// NOMERGE-NOT:   torch.aten.mm
// NOMERGE:       %[[XA:[0-9]+]] = torch.aten.matmul %arg5, %{{[0-9]+}} {bt.time = #bt.time<"dynamic">}
// NOMERGE-NOT:   torch.aten.mm
// NOMERGE:       %[[XAB:[0-9]+]] = torch.aten.matmul %[[XA]], %{{[0-9]+}} {bt.time = #bt.time<"dynamic">}
// NOMERGE-NEXT:  %[[SC:[0-9]+]] = torch.aten.mul.Scalar %[[XAB]], %float2.000000e00 {bt.time = #bt.time<"dynamic">}
// NOMERGE-NEXT:  %[[Y0:[0-9]+]] = torch.aten.add.Tensor %[[XW]], %[[SC]], %int1 {bt.time = #bt.time<"dynamic">}
// NOMERGE-NOT:   torch.aten.mm %{{[0-9]+}}
// NOMERGE:       %[[PQ:[0-9]+]] = torch.aten.mm %arg3, %arg4 {bt.time = #bt.time<"static">}
// NOMERGE-NEXT:  %[[Y2:[0-9]+]] = torch.aten.matmul %arg5, %[[PQ]] {bt.time = #bt.time<"dynamic">}
// NOMERGE-NEXT:  return %[[Y0]], %{{[0-9]+}}, %[[Y2]] :
// NOMERGE-LABEL: func.func @main_factorized

// A "factorized" program serves each row's adapter from its factors: the
// pass leaves it as it is (no merge, no reassociation).
// FACTORIZED-LABEL: func.func @main_factorized
// FACTORIZED-SAME:    attributes {bt.program = "factorized"}
// FACTORIZED-NOT:   torch.aten.mm
// FACTORIZED:       %[[XW:[0-9]+]] = torch.aten.matmul %arg5, %{{[0-9]+}} {bt.time = #bt.time<"dynamic">}
// FACTORIZED-NEXT:  %[[AT:[0-9]+]] = torch.aten.transpose.int %arg1
// FACTORIZED-NEXT:  %[[XA:[0-9]+]] = torch.aten.matmul %arg5, %[[AT]] {bt.time = #bt.time<"dynamic">}
// FACTORIZED-NEXT:  %[[BT:[0-9]+]] = torch.aten.transpose.int %arg2
// FACTORIZED-NEXT:  %[[XAB:[0-9]+]] = torch.aten.matmul %[[XA]], %[[BT]] {bt.time = #bt.time<"dynamic">}
// FACTORIZED-NEXT:  %[[SC:[0-9]+]] = torch.aten.mul.Scalar %[[XAB]], %float2.000000e00 {bt.time = #bt.time<"dynamic">}
// FACTORIZED-NEXT:  %[[Y0:[0-9]+]] = torch.aten.add.Tensor %[[XW]], %[[SC]], %int1 {bt.time = #bt.time<"dynamic">}
// FACTORIZED-NEXT:  %[[XP:[0-9]+]] = torch.aten.matmul %arg5, %arg3 {bt.time = #bt.time<"dynamic">}
// FACTORIZED-NEXT:  %[[Y2:[0-9]+]] = torch.aten.matmul %[[XP]], %arg4 {bt.time = #bt.time<"dynamic">}
// FACTORIZED-NEXT:  return %[[Y0]], %[[Y2]] :
func.func @main(%arg0: !torch.vtensor<[16,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[2,8],f32> {bt.name = "fc.lora_A.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[16,2],f32> {bt.name = "fc.lora_B.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[8,16],f32> {bt.name = "p", bt.time = #bt.time<"static">}, %arg4: !torch.vtensor<[16,4],f32> {bt.name = "q", bt.time = #bt.time<"static">}, %arg5: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> (!torch.vtensor<[?,16],f32>, !torch.vtensor<[?,16],f32>, !torch.vtensor<[?,4],f32>) attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %float2.000000e00 = torch.constant.float 2.000000e+00 {bt.time = #bt.time<"static">}
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[16,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,16],f32>
  %1 = torch.aten.matmul %arg5, %0 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,16],f32> -> !torch.vtensor<[?,16],f32>
  %2 = torch.aten.transpose.int %arg1, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[2,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,2],f32>
  %3 = torch.aten.matmul %arg5, %2 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,2],f32> -> !torch.vtensor<[?,2],f32>
  %4 = torch.aten.transpose.int %arg2, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[16,2],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,16],f32>
  %5 = torch.aten.matmul %3, %4 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,2],f32>, !torch.vtensor<[2,16],f32> -> !torch.vtensor<[?,16],f32>
  %6 = torch.aten.mul.Scalar %5, %float2.000000e00 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.float -> !torch.vtensor<[?,16],f32>
  %7 = torch.aten.add.Tensor %1, %6, %int1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.vtensor<[?,16],f32>, !torch.int -> !torch.vtensor<[?,16],f32>
  %8 = torch.aten.matmul %arg5, %2 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,2],f32> -> !torch.vtensor<[?,2],f32>
  %9 = torch.aten.matmul %8, %4 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,2],f32>, !torch.vtensor<[2,16],f32> -> !torch.vtensor<[?,16],f32>
  %10 = torch.aten.matmul %arg5, %arg3 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,16],f32> -> !torch.vtensor<[?,16],f32>
  %11 = torch.aten.matmul %10, %arg4 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.vtensor<[16,4],f32> -> !torch.vtensor<[?,4],f32>
  return %7, %9, %11 : !torch.vtensor<[?,16],f32>, !torch.vtensor<[?,16],f32>, !torch.vtensor<[?,4],f32>
}

func.func @main_factorized(%arg0: !torch.vtensor<[16,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[2,8],f32> {bt.name = "fc.lora_A.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[16,2],f32> {bt.name = "fc.lora_B.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[8,16],f32> {bt.name = "p", bt.time = #bt.time<"static">}, %arg4: !torch.vtensor<[16,4],f32> {bt.name = "q", bt.time = #bt.time<"static">}, %arg5: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> (!torch.vtensor<[?,16],f32>, !torch.vtensor<[?,4],f32>) attributes {bt.program = "factorized"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %float2.000000e00 = torch.constant.float 2.000000e+00 {bt.time = #bt.time<"static">}
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[16,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,16],f32>
  %1 = torch.aten.matmul %arg5, %0 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,16],f32> -> !torch.vtensor<[?,16],f32>
  %2 = torch.aten.transpose.int %arg1, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[2,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,2],f32>
  %3 = torch.aten.matmul %arg5, %2 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,2],f32> -> !torch.vtensor<[?,2],f32>
  %4 = torch.aten.transpose.int %arg2, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[16,2],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,16],f32>
  %5 = torch.aten.matmul %3, %4 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,2],f32>, !torch.vtensor<[2,16],f32> -> !torch.vtensor<[?,16],f32>
  %6 = torch.aten.mul.Scalar %5, %float2.000000e00 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.float -> !torch.vtensor<[?,16],f32>
  %7 = torch.aten.add.Tensor %1, %6, %int1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.vtensor<[?,16],f32>, !torch.int -> !torch.vtensor<[?,16],f32>
  %8 = torch.aten.matmul %arg5, %arg3 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,16],f32> -> !torch.vtensor<[?,16],f32>
  %9 = torch.aten.matmul %8, %arg4 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.vtensor<[16,4],f32> -> !torch.vtensor<[?,4],f32>
  return %7, %9 : !torch.vtensor<[?,16],f32>, !torch.vtensor<[?,4],f32>
}
